"""Code reward: 1.0 iff the program in the final response passes all of the problem's unit tests.

METHOD.md "Rewards per domain": code scores 1 iff all unit tests pass (strict binary), and model-written
code runs in a sandbox (:mod:`nemocascade.sandbox`: namespaces, an unprivileged uid, resource limits
and an audit hook; see there).

Pipeline of :func:`score` (any failure, exception included, scores 0.0):

1. Final text: ``nemocascade.chat.strip_think`` (an unfinished think block has no answer -> 0); a final
   text over ``extract.MAX_ANSWER_CHARS`` (64K characters) scores 0 before anything else reads it.
2. Code: the body of the LAST fenced block tagged ``python``/``py``/``python3`` or untagged
   (:func:`nemocascade.rewards.extract.last_python_block`, linear time); the whole final text when there
   is no such block.
3. Ground truth ``answer`` is a JSON object ``{"tests": str, "entry_point": str, "prompt": str?}``.
   ``prompt`` (HumanEval) is the function header + docstring the model was asked to complete: it goes
   in front of the code, so a bare function body completes it and a full definition replaces it. The
   prompt's other definitions (HumanEval's ``encode_cyclic``, ``poly``, ...) are trusted: they run again
   in front of the tests, so a program that redefines what the tests call does not change the tests.
4. :func:`passes_tests`: the program runs in the sandbox under the test harness (``sandbox_boot.py``):
   program first, then the tests in a namespace of their own, and 1.0 iff the harness's verdict, carrying
   a per-run secret the program cannot read, arrives after the last test returned. The program runs as
   module ``solution``: an ``if __name__ == "__main__":`` block (a demo, ``unittest.main()``) does not run.

What the harness guarantees, and what it does not (details in ``nemocascade/sandbox.py``):
  * the exit status decides nothing: ``sys.exit(0)``, ``os._exit(0)``, ``raise SystemExit``, exit
    handlers, ``sys.excepthook``, ``__del__`` at shutdown, a thread that exits later, a printed fake
    verdict -- any exit before the tests finished scores 0;
  * the tests compare plain values only (int, float, str, list, dict, ... recursively; a subclass of a
    builtin counts as its builtin value): an object whose ``__eq__``/``__bool__``/``__sub__`` always
    agrees fails, as does any value that is not plain;
  * the tests see the builtins and the modules they import as they were before the program ran, are never
    on disk, and no frame object (``sys._getframe``, tracebacks' ``tb_frame``, generators' ``gi_frame``,
    signal handlers, trace functions) reaches the program, so it cannot read their expected values;
  * not stopped: memory corruption (crafted bytecode through ``marshal``), a test that hands one of its
    own functions to the program (``__globals__`` is then the tests' namespace), classes the program
    reaches through ``object.__subclasses__()`` (a fresh module's ``random.Random`` or ``string.Formatter``,
    and through them that module's globals), a package's submodules (copied one level deep: ``re._compile``,
    ``collections.Counter``), and weak tests themselves. ``tests/test_reward_hacks.py`` pins each open case
    as a strict xfail.

:data:`SCORE_TIMEOUT_S` bounds one sandboxed run; keep a ``VerifierPool`` timeout above it (sandbox
start-up is ~0.1 s), or the pool kills the worker first (the sandbox then dies with it).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence

from nemocascade import sandbox
from nemocascade.chat import strip_think
from nemocascade.rewards.extract import MAX_ANSWER_CHARS, last_python_block

SCORE_TIMEOUT_S = 3.0


def passes_tests(program: str, tests: str | Sequence[str], timeout_s: float = 5.0) -> bool:
    """True iff the trusted ``tests`` pass against ``program`` in the sandbox's harness within ``timeout_s``
    (wall clock) and the default memory/CPU/output limits (module docstring).

    ``tests``: Python source (e.g. asserts), or a sequence of source lines, joined with newlines. Anything
    else is a TypeError (formatting a list into the program would run nothing and pass).
    """
    if not isinstance(tests, str):
        if not all(isinstance(t, str) for t in tests):
            raise TypeError(f"tests must be source text or a sequence of source lines, got {tests!r:.80}")
        tests = "\n".join(tests)
    return sandbox.run_python(program, timeout_s=timeout_s, tests=tests).ok


def extract_code(final: str) -> str:
    """The last fenced Python block of ``final`` (module docstring), else ``final`` itself."""
    block = last_python_block(final)
    return final if block is None else block


def trusted_prompt(prompt: str, entry_point: str) -> str:
    """``prompt`` without the definition of ``entry_point``: the helpers the tests may call (step 3)."""
    tree = ast.parse(prompt)
    tree.body = [n for n in tree.body
                 if not (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == entry_point)]
    return ast.unparse(tree)


def score(completion: str, answer: str, in_think: bool = False) -> float:
    """1.0 if the code in ``completion``'s final response passes ``answer``'s tests, else 0.0.

    ``in_think``: as in ``nemocascade.rewards.math.score`` (see ``chat.strip_think``). Never raises.
    """
    try:
        final = strip_think(completion, in_think=in_think)
        if len(final) > MAX_ANSWER_CHARS:
            return 0.0
        spec = json.loads(answer)
        tests, prompt = spec["tests"], spec.get("prompt", "")
        if not final.strip() or not isinstance(tests, str) or not isinstance(prompt, str):
            return 0.0
        if prompt:
            tests = f"{trusted_prompt(prompt, spec['entry_point'])}\n\n{tests}"
        return 1.0 if passes_tests(prompt + extract_code(final), tests, timeout_s=SCORE_TIMEOUT_S) else 0.0
    except Exception:  # a verifier bug must cost one reward, never the RL step
        return 0.0
