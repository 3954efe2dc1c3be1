"""The code in a completion: the last fenced Python block, found in one pass over the lines.

Shared by ``rewards/code.py`` and ``rewards/swe.py``. Not a regex: one with a lazy body and a line-anchored
closer, retried from every opener, is quadratic (over a minute on a 200 KB completion of openers without a
closer); this scan is linear. The callers also refuse a final answer (the text after the reasoning,
``chat.strip_think``, itself linear) over :data:`MAX_ANSWER_CHARS` before extracting anything: far above any
real program here, while the reasoning before it may be long (C2 samples up to 64K tokens).

Rules, per line:
  * an opener ends with three backticks plus a tag ``python``/``py``/``python3`` (any case) or none, then
    optional blanks (the backticks may follow other text on the line);
  * a line starting (after blanks) with three backticks and another tag (````` ```json `````) opens a block in
    another language, skipped whole (so its closer does not open a Python block);
  * inside a block, the first line starting (after blanks) with three backticks closes it;
  * the body is the lines in between, each with its newline; an unclosed block does not count.
"""

from __future__ import annotations

MAX_ANSWER_CHARS = 64 * 1024
_FENCE = "```"
_PYTHON_TAGS = ("", "python", "py", "python3")


def last_python_block(text: str) -> str | None:
    """Body of the last closed fenced block tagged python/py/python3 or untagged (module docstring); None if
    there is none."""
    lines = text.split("\n")
    last, body, python = None, None, False
    for i, line in enumerate(lines):
        if body is not None:  # inside a block
            if not line.lstrip(" \t").startswith(_FENCE):
                if python:
                    body.append(line + "\n")
                continue
            if python:
                last = "".join(body)
            body, line = None, line.lstrip(" \t")[len(_FENCE):]  # what follows the closer may open a block
        if i < len(lines) - 1:  # an opener needs its newline
            python = _opens(line)
            body = None if python is None else []
    return last


def _opens(line: str) -> bool | None:
    """True if ``line`` opens a Python block, False another language's, None neither."""
    at = line.rfind(_FENCE)
    if at < 0:
        return None
    tag = line[at + len(_FENCE):].strip(" \t\r").lower()
    if tag in _PYTHON_TAGS:
        return True
    return False if line.lstrip(" \t").startswith(_FENCE) and "`" not in tag else None
