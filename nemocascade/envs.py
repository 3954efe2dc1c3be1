"""Environments for multi-turn rollouts (C2's agentic stages): the model acts, the environment answers.

    env = make_env(name, record)     # one per episode
    first = env.reset()              # the first user message (by default the record's prompt)
    step = env.step(action_text)     # Step(observation, reward, done, tool_error)

An environment is registered by name (`register_env`) and picked per domain like a reward: a domain's record
names its environment (`data.domains.Domain.env`), a stage's `envs` overrides it. The episode's reward is the
reward of its last step (a trajectory cut by a budget is scored on what it wrote last). Built-ins:

``swe_repair`` (domain swe)
    the model writes the whole fixed function; the environment runs ALL the record's tests under the sandbox's
    harness (`rewards.code.passes_tests`): pass -> reward 1, done. Otherwise it runs the function on the shown
    test and answers in the domain's prompt format, the model's code as the new buggy code: "Fix the bug.
    <code> Failing: <shown test>, got <value>". If the shown test passes but a hidden one fails, the episode
    ends with reward 0 (as in SWE-bench, the grading tests are hidden). No code block: a tool error, asked again.
``tool_exec`` (domain tool)
    the model makes one `<tool_call>`; a well-formed call of a listed tool with correctly typed arguments is
    EXECUTED (`ToolWorld`: alarms, a shopping list, bookings, ... and deterministic weather) and answered with
    `<tool_response>{result}</tool_response>`, done; reward 1 iff it is the requested call (the domain's
    verifier). A malformed call, an unlisted tool or a wrongly typed argument is a tool error, answered with the
    error and the parameter named, so the model can call again (the domain's teacher quotes integers: the
    environment says so).
``python`` (any domain with a verifier)
    a reply with a ```python block runs it in the sandbox and returns its output (stdout, then stderr, cut to
    `OUTPUT_CHARS`), reward 0; a reply without one is the final answer, scored by the domain's reward, done.

Safety: model-written code runs only in `nemocascade.sandbox` (namespaces, a read-only root, a scratch tmpfs, an
unprivileged uid, limits, the audit hook), so an action never touches the run's files. ``tool_exec`` runs no
model code: it executes our own functions on JSON arguments checked against the signature first.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import secrets
from collections.abc import Callable

from nemocascade import sandbox
from nemocascade.chat import strip_think
from nemocascade.data import domains
from nemocascade.data import tool as tool_data
from nemocascade.rewards import code as code_reward
from nemocascade.rewards import swe
from nemocascade.rewards import tool as tool_reward
from nemocascade.rewards.extract import last_python_block
from nemocascade.rewards.structured import MALFORMED

OUTPUT_CHARS = 300  # an observation quotes at most this much of a program's output
STEP_TIMEOUT_S = 5.0  # one sandboxed run


@dataclasses.dataclass(frozen=True)
class Step:
    observation: str  # what the environment says next (rendered as the next user turn)
    reward: float     # the reward if the episode ended here
    done: bool
    tool_error: bool = False  # the action could not be carried out (no code, malformed call, bad argument)


class Env:
    """One episode of one record. Subclasses implement `step`; `reset` returns the first user message."""

    def __init__(self, record: dict):
        self.record = record

    def reset(self) -> str:
        return self.record["prompt"]

    def step(self, action: str) -> Step:
        raise NotImplementedError


ENVS: dict[str, Callable[[dict], Env]] = {}


def register_env(name: str, factory: Callable[[dict], Env]) -> None:
    ENVS[name] = factory


def env_name(domain: str, overrides=None) -> str | None:
    """The environment of `domain`: the stage's override, else its default; None when it has none."""
    record = domains.DOMAINS.get(domain)
    return (overrides or {}).get(domain) or (record.env if record else None)


def make_env(name: str, record: dict) -> Env:
    try:
        return ENVS[name](record)
    except KeyError:
        raise KeyError(f"no environment {name!r}; registered: {sorted(ENVS)}") from None


# ---------------------------------------------------------------------------------------------------- swe


def _call_of(test: str) -> tuple[str, str]:
    """("f([3, 7, 2])", "7") of a generated test line "assert f([3, 7, 2]) == 7"."""
    node = ast.parse(test).body[0].test
    return ast.unparse(node.left), ast.unparse(node.comparators[0])


def run_call(code: str, call: str, timeout_s: float = STEP_TIMEOUT_S) -> str:
    """What `call` returns after `code` runs, in the sandbox (plain run): its repr, the exception's name, or
    "a timeout" / "no result". The program's own output cannot pose as the result: it is read after a
    per-run marker printed by our line, the last line of output."""
    marker = secrets.token_hex(8)
    program = (f"{code}\n\ntry:\n    _r = repr({call})\nexcept BaseException as _e:\n    _r = type(_e).__name__\n"
               f"print('\\n{marker}' + _r)\n")
    res = sandbox.run_python(program, timeout_s=timeout_s)
    if res.timed_out:
        return "a timeout"
    lines = res.stdout.rstrip("\n").split("\n")
    return lines[-1][len(marker):][:OUTPUT_CHARS] if lines and lines[-1].startswith(marker) else "no result"


class SweRepair(Env):
    """Execution-based repair (module docstring). `record["answer"]`: data/swe.py's {"fix", "buggy", "tests"}."""

    ASK = "Reply with the whole fixed function in a ```python block."

    def __init__(self, record: dict):
        super().__init__(record)
        self.spec = json.loads(record["answer"])
        self.call, self.expected = _call_of(self.spec["tests"][0])

    def step(self, action: str) -> Step:
        code = swe.extract_code(action)
        if swe.parse_code(code) is None:
            return Step(f"No Python code block found. {self.ASK}", 0.0, False, tool_error=True)
        if code_reward.passes_tests(code, self.spec["tests"], timeout_s=STEP_TIMEOUT_S):
            return Step("All tests pass.", 1.0, True)
        got = run_call(code, self.call)
        if got == self.expected:  # the shown test passes, a hidden one does not: the agent believes it is done
            return Step("The shown test passes.", 0.0, True)
        test, code = self.spec["tests"][0], code.strip("\n")
        return Step(f"Fix the bug.\n```python\n{code}\n```\nFailing: {test}, got {got}", 0.0, False)


# --------------------------------------------------------------------------------------------------- tool


class ToolWorld:
    """The tools of data/tool.py as functions over a small world (one per episode): they change it and answer."""

    def __init__(self):
        self.alarms, self.items, self.bookings, self.sent, self.lights, self.playing = [], {}, [], [], {}, None

    def get_weather(self, city, days):
        seed = sum(map(ord, city)) * 31
        temps = [(seed // (d + 1)) % 25 + 5 for d in range(days)]
        return {"city": city, "days": days, "high_c": max(temps), "low_c": min(temps)}

    def set_alarm(self, hour, label):
        self.alarms.append((hour, label))
        return {"alarm": len(self.alarms), "hour": hour, "label": label}

    def send_message(self, to, text):
        self.sent.append((to, text))
        return {"sent": True, "to": to}

    def play_music(self, genre, room, loud):
        self.playing = (genre, room, loud)
        return {"playing": genre, "room": room, "volume": "loud" if loud else "quiet"}

    def add_item(self, item, count):
        self.items[item] = self.items.get(item, 0) + count
        return {"item": item, "on_list": self.items[item]}

    def book_table(self, name, people):
        self.bookings.append((name, people))
        return {"booking": len(self.bookings), "name": name, "people": people}

    def set_light(self, room, color, on):
        self.lights[room] = (color, on)
        return {"room": room, "color": color, "on": on}


JSON_TYPES = {"string": str, "integer": int, "boolean": bool}


def type_error(value, kind: str) -> bool:
    """True when `value` is not of JSON type `kind` (a bool is no integer, "13" is no integer)."""
    want = JSON_TYPES[kind]
    return not isinstance(value, want) or (want is int and isinstance(value, bool))


class ToolExec(Env):
    """Tool calling with execution (module docstring). `record["answer"]`: data/tool.py's expected call."""

    def __init__(self, record: dict):
        super().__init__(record)
        self.tools = tool_data.TOOLS
        listed = record["prompt"].split("Request:")[0]
        self.listed = [name for name in self.tools if f"{name}(" in listed]
        self.world = ToolWorld()

    def _error(self, message: str) -> Step:
        return Step(f"<tool_response>{json.dumps({'error': message})}</tool_response>", 0.0, False, tool_error=True)

    def step(self, action: str) -> Step:
        try:
            call = tool_reward.parse_call(strip_think(action))
        except MALFORMED:
            call = None
        if call is None:
            return self._error('expected one <tool_call>{"name": ..., "arguments": {...}}</tool_call>')
        name, args = call["name"], call["arguments"]
        if name not in self.listed:
            return self._error(f"unknown tool {str(name)[:40]!r}; tools: {', '.join(self.listed)}")
        params = self.tools[name][0]
        missing = [p for p, _, _ in params if p not in args]
        extra = sorted(set(args) - {p for p, _, _ in params})
        if missing or extra:
            return self._error(f"{name}: missing {missing}, unexpected {[str(e)[:20] for e in extra]}")
        for p, kind, _ in params:
            if type_error(args[p], kind):
                return self._error(f"{name}: argument {p} must be a JSON {kind}, got {json.dumps(args[p])[:40]}")
        result = getattr(self.world, name)(**{p: args[p] for p, _, _ in params})
        reward = tool_reward.score(action, self.record["answer"])
        return Step(f"<tool_response>{json.dumps(result)}</tool_response>", reward, True)


# ------------------------------------------------------------------------------------------------- python


class PythonTool(Env):
    """A Python interpreter the model may call before it answers (module docstring)."""

    def step(self, action: str) -> Step:
        code = last_python_block(strip_think(action))
        if code is None:
            return Step("", domains.verifier(self.record["domain"])(action, self.record["answer"]), True)
        res = sandbox.run_python(code, timeout_s=STEP_TIMEOUT_S)
        out = (res.stdout + res.stderr)[-OUTPUT_CHARS:]
        return Step("Output:\n" + out + ("\n(timed out)" if res.timed_out else ""), 0.0, False,
                    tool_error=not res.ok)


register_env("swe_repair", SweRepair)
register_env("tool_exec", ToolExec)
register_env("python", PythonTool)
