"""SWE repair rewards (METHOD.md "Rewards per domain", SWE): agentless similarity and test execution.

Both read the repaired function from the LAST ```` ```python ```` (or ``py``/``python3``/plain) fenced
block of the final text (``nemocascade.chat.strip_think``; an unfinished think block has none), its
closing fence at the start of a line (``rewards/extract.py``, shared with ``rewards/code.py``); a final
text over ``extract.MAX_ANSWER_CHARS`` counts as having no block. ``answer`` is the JSON string
``{"fix": golden code, "buggy": original code, "tests": [assert lines]}`` written by ``data/swe.py``.

:func:`agentless_score` (C1 agentless RL; domain ``"swe"``)::

    -1.0  no code block, an empty one, or code that does not parse
     1.0  ast.dump(code) == ast.dump(fix)        (same program: layout and comments do not count)
     0.0  ast.dump(code) == ast.dump(buggy)      (unchanged)
     else difflib ratio of the normalised texts: 2*M / (len(a) + len(b)), where a, b are
          ast.unparse(parse(code)), ast.unparse(parse(fix)) and M is the number of characters in
          SequenceMatcher's matching blocks (autojunk off, so the formula holds at any length);
          in [0, 1), about 0.9-0.99 for a one-token wrong edit of the small functions here.

Equality is checked before similarity, so only the golden program scores 1. The score is C1's, which
rewards near misses highly; the agentic stage's :func:`execution_score` (domain ``"swe_exec"``) is
strict: 1.0 iff the code passes every test under ``nemocascade.rewards.code.passes_tests`` (sandboxed,
5 s, the tests run by the sandbox's harness: no exit status or always-equal object passes), else 0.0.
"""

from __future__ import annotations

import ast
import difflib
import json

from nemocascade.chat import strip_think
from nemocascade.rewards.extract import MAX_ANSWER_CHARS, last_python_block

EXEC_TIMEOUT_S = 5.0


def extract_code(completion: str) -> str | None:
    """Content of the last fenced Python block of ``completion``'s final text; None if there is none or
    the final text is over-long."""
    final = strip_think(completion)
    return None if len(final) > MAX_ANSWER_CHARS else last_python_block(final)


def parse_code(code: str | None) -> ast.Module | None:
    """The parsed module, or None for missing, empty or unparsable code."""
    if code is None:
        return None
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: NUL bytes
        return None
    return tree if tree.body else None


def similarity(code: str, fix: str) -> float:
    """``2*M / (len(a)+len(b))`` over the ``ast.unparse`` normal forms (module docstring); both must parse."""
    a, b = ast.unparse(ast.parse(code)), ast.unparse(ast.parse(fix))
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def agentless_score(completion: str, answer: str) -> float:
    """C1's agentless repair reward in {-1} U [0, 1] (module docstring); never raises."""
    try:
        spec = json.loads(answer)
        tree = parse_code(extract_code(completion))
        if tree is None:
            return -1.0
        dump = ast.dump(tree)
        if dump == ast.dump(ast.parse(spec["fix"])):
            return 1.0
        if dump == ast.dump(ast.parse(spec["buggy"])):
            return 0.0
        return similarity(ast.unparse(tree), spec["fix"])
    except Exception:  # a malformed answer string: no reward, never a crash
        return 0.0


def execution_score(completion: str, answer: str) -> float:
    """1.0 iff the repaired function passes all of ``answer``'s tests, else 0.0; never raises on model output.

    The sandbox lives in ``nemocascade.rewards.code`` (imported here, lazily, so the agentless reward does
    not depend on it); a missing module is a setup error and raises ImportError instead of scoring 0.
    """
    from nemocascade.rewards.code import passes_tests

    try:
        spec = json.loads(answer)
        code = extract_code(completion)
        if parse_code(code) is None:
            return 0.0
        return 1.0 if passes_tests(code, spec["tests"], timeout_s=EXEC_TIMEOUT_S) else 0.0
    except Exception:  # a verifier failure must cost one reward, never the RL step
        return 0.0
