"""Frames that look like upstream's, for the C functions that stand in for
upstream's Python ones.

A Python function of torch's that C now runs leaves no frame: an exception
passing through it would lack the entry upstream's frame gives its traceback
(file, line, function name, the columns ``traceback`` underlines). So, as
Cython adds traceback entries for its C functions, the C side calls a
*frame stub* on its way out with an exception: a function compiled from a
few lines of source placed so that its one call has exactly the position
(line and columns) of the upstream instruction the exception left from,
with upstream's file name, first line, function name, qualified name,
parameters and free variables. Called with the arguments of the call it
stands for (its frame made over that call's closure) it runs
``f(*args, **kwargs)`` at that position, where ``f`` is a constant given
when the stub is made: the C re-raiser (``_C._reraise``, which raises the
exception C keeps for it) for traceback entries; on CPython 3.11, whose interpreter runs a Python function's frame
without its vectorcall, the C object itself, so that the function keeps
upstream's identity with this code as its ``__code__`` (see
``_compile_wrapper``).

The source line shown in a traceback is read from the file by line number,
so it is upstream's own.
"""

from __future__ import annotations

import dis
import sys
import types
from typing import NamedTuple



class Position(NamedTuple):
    lineno: int
    end_lineno: int
    col: int | None       # None where the interpreter records lines only (3.10)
    end_col: int | None


def position(ins: dis.Instruction) -> Position | None:
    """The source position of one instruction (3.11 on: line and columns)."""
    pos = getattr(ins, "positions", None)
    if pos is not None and pos.lineno is not None:
        return Position(pos.lineno, pos.end_lineno, pos.col_offset, pos.end_col_offset)
    line = ins.starts_line if isinstance(ins.starts_line, int) else None
    return None if line is None else Position(line, line, None, None)


def instruction_positions(code: types.CodeType) -> list[tuple[dis.Instruction, Position | None]]:
    """Each instruction of ``code`` with its position (3.10: the line it is
    on, carried over from the instruction that starts it)."""
    out = []
    line = None
    for ins in dis.get_instructions(code):
        pos = position(ins)
        if pos is not None and pos.col is None:
            line = pos.lineno
        elif pos is None and line is not None and sys.version_info < (3, 11):
            pos = Position(line, line, None, None)
        out.append((ins, pos))
    return out


_VARARGS = 0x04      # inspect.CO_VARARGS
_VARKEYWORDS = 0x08  # inspect.CO_VARKEYWORDS


def _parameters(code: types.CodeType) -> tuple[str, str]:
    """``code``'s parameter list as source, and the arguments that pass its
    parameters on as they came (defaults are the function's, not the
    code's: a stub has none)."""
    names = list(code.co_varnames)
    n = code.co_argcount + code.co_kwonlyargcount
    params = names[:code.co_argcount]
    args = names[:code.co_argcount]
    i = n
    if code.co_flags & _VARARGS:
        params.append("*" + names[i])
        args.append("*" + names[i])
        i += 1
    elif code.co_kwonlyargcount:
        params.append("*")
    params += names[code.co_argcount:n]
    args += [f"{k}={k}" for k in names[code.co_argcount:n]]
    if code.co_flags & _VARKEYWORDS:
        params.append("**" + names[i])
        args.append("**" + names[i])
    return ", ".join(params), ", ".join(args)


def _statement(body: int, lead: str, head: str, at: Position) -> list[str] | None:
    """The source lines of ``lead (…(head…)…)`` indented by ``body``, its
    call (``head`` up to its closing parenthesis) spanning ``at`` exactly:
    parentheses around it move it right, blanks before its closing one
    stretch it. None where it does not fit."""
    if at.col is None:
        return [" " * body + lead + head + ")"]
    k = at.col - body - len(lead)
    if k < 0:
        return None
    first = " " * body + lead + "(" * k + head
    if at.end_lineno == at.lineno:
        room = at.end_col - 1 - len(first)
        return None if room < 0 else [first + " " * room + ")" + ")" * k]
    return ([first] + [""] * (at.end_lineno - at.lineno - 1)
            + [" " * (at.end_col - 1) + ")" + ")" * k])


def _function(code: types.CodeType, steps: list, constant, globals_: dict):
    """A function with ``code``'s name, qualified name, file, parameters and
    free variables (as empty cells) whose body is ``steps`` in order: each
    ``(at, lead, head)``, a statement whose call sits at ``at`` (increasing,
    not overlapping), or a plain statement (a str) on the line after the
    step before it; ``f`` in them is ``constant`` (with ``constant`` None,
    the code keeps ``_C.FRAME_PLACEHOLDER`` there, for the C side to put its
    own object in). None where the positions cannot be reproduced."""
    from . import _C

    placeholder = _C.FRAME_PLACEHOLDER
    params, _ = _parameters(code)
    freevars = code.co_freevars
    placed = [st for st in steps if not isinstance(st, str)]
    body = 8 if placed[0][0].col is None else min(at.col - len(lead) for at, lead, _ in placed)
    if body <= 4:
        return None
    # def __outer__(): / <free variables> = None / ... /
    #     def <name>(<params>):            code's first line (inspect reads the
    #                                      function's source from there)
    #         f = <constant>               the line after
    #         <steps>
    #         (<free variables>,)          unreached: keeps them free
    lines = ["def __outer__():"] + ([f"    {' = '.join(freevars)} = None"] if freevars else [])
    first = placed[0][0].lineno
    if not len(lines) < code.co_firstlineno < first - 1:
        return None
    lines += [""] * (code.co_firstlineno - 1 - len(lines))
    lines += [f"    def {code.co_name}({params}):", " " * body + f"f = {placeholder!r}"]
    for step in steps:
        if isinstance(step, str):
            lines.append(" " * body + step)
            continue
        at, lead, head = step
        if len(lines) >= at.lineno:
            return None
        lines += [""] * (at.lineno - 1 - len(lines))
        text = _statement(body, lead, head, at)
        if text is None:
            return None
        lines += text
    if freevars:
        lines.append(" " * body + "(" + ", ".join(freevars) + ",)")
    outer = compile("\n".join(lines) + "\n", code.co_filename, "exec")
    outer_fn = next(c for c in outer.co_consts if isinstance(c, types.CodeType))
    inner = next(c for c in outer_fn.co_consts if isinstance(c, types.CodeType))
    if inner.co_freevars != freevars:
        return None
    replace = {}
    if constant is not None:
        replace["co_consts"] = tuple(
            constant if isinstance(c, str) and c == placeholder else c for c in inner.co_consts
        )
    if hasattr(code, "co_qualname"):
        replace["co_qualname"] = code.co_qualname
    inner = inner.replace(**replace) if replace else inner
    closure = tuple(types.CellType() for _ in freevars) or None
    return types.FunctionType(inner, globals_, code.co_name, None, closure)


def stub(code: types.CodeType, at: Position, constant, globals_: dict):
    """A frame stub: ``code``'s function with one call, ``constant(<its
    arguments>)`` returned, at position ``at`` (on 3.10, on its line)."""
    _, args = _parameters(code)
    return _function(code, [(at, "return ", f"f({args}")], constant, globals_)


def trampoline(code: types.CodeType, at_call: Position, exits: list, globals_: dict):
    """CPython 3.11: the code of a function whose calls C runs. Its one
    frame calls the C object (the placeholder constant) at ``at_call``, with
    the frame's ``args`` tuple and ``kwargs`` dict,
    which returns the result or raises from there; or returns itself, and
    the exception it keeps is then raised by ``f._exit(k)`` at the
    position of exit k (``exits``: ``(k, Position)``, in order), so that the
    traceback entry is the one upstream's frame gives at that exit. None
    where it cannot be laid out."""
    # the frame's args and kwargs, passed as they are (the C object takes the
    # tuple and the dict): compile_wrapper's parameters are (*args, **kwargs)
    if _parameters(code)[0] != "*args, **kwargs":
        return None
    steps = [(at_call, "r = ", "f(args, kwargs"), "if r is not f: return r"]
    steps += [(at, "", f"f._exit({k}") for k, at in exits]
    steps.append("return f._exit(-1)")
    fn = _function(code, steps, None, globals_)
    return None if fn is None else fn.__code__


def _loads(instructions, i: int, back: int = 8) -> list:
    """The argvals of the instructions just before instructions[i]."""
    return [ins.argval for ins, _ in instructions[max(0, i - back):i]]


def call_of(code: types.CodeType, callee: str) -> Position | None:
    """The position of the last ``<callee>(*args, **kwargs)`` in code (the
    latest in the source: the one after the set-up, where a function calls
    it on several paths)."""
    found = None
    instructions = instruction_positions(code)
    for i, (ins, pos) in enumerate(instructions):
        if ins.opname == "CALL_FUNCTION_EX" and pos is not None and callee in _loads(instructions, i):
            if found is None or pos.lineno >= found.lineno:
                found = pos
    return found


def raise_after(code: types.CodeType, *names: str, nargs: int) -> Position | None:
    """The position of the first ``raise`` of ``nargs`` operands (1: raise X,
    2: raise X from Y) whose operands load every one of ``names``."""
    instructions = instruction_positions(code)
    for i, (ins, pos) in enumerate(instructions):
        if ins.opname == "RAISE_VARARGS" and ins.arg == nargs and pos is not None:
            loads = _loads(instructions, i)
            if all(n in loads for n in names):
                return pos
    return None
