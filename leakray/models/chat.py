"""A code continuation asked of a chat model (`/v1/chat/completions`), and read back from its answer.

Most hosted models speak only the chat API: there is no raw prompt to continue, the model is asked
in words. `messages` asks it to continue the given text from exactly where it stops (the text is
the user message's last part, so its end is the cut); `given_of` inverts that, for a server that
plays such a model (`endpoint_server`). A chat model rarely answers with the bare continuation:
it wraps code in Markdown fences, opens with a sentence, or writes out the code it was given before
going on. `continuation_span` finds where the continuation lies in the answer (one contiguous span,
so the answer's token log-probs can be matched to it), and says which of those habits it undid.

What it cannot undo, it leaves: an answer that rewrites the given code (not a repeat of it) is
read from its first line as the continuation, and one whose body is indented otherwise than the
given text is kept as written (executing it then fails, as a wrong continuation does).
"""

from __future__ import annotations

SYSTEM = ("You complete code. Reply with only the text that comes right after the code you are given, "
          "as plain code: no explanation, no Markdown, and do not repeat the given code.")
USER = "Continue this code from exactly where it stops:\n\n"

# what `continuation_span` undid in an answer, as row notes (each at most once per row)
FENCED = "chat_answer_fenced"
PROSE = "chat_answer_prose_before_code"
REPEATED = "chat_answer_repeated_the_code"
_MIN_REPEAT = 8  # characters of the given text an answer must repeat to be read as a repeat of it


def messages(given: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER + given}]


def given_of(msgs: list[dict]) -> str:
    """The text a `messages` request asks to continue (its last user message, our header off)."""
    content = next((m.get("content") for m in reversed(msgs) if m.get("role") == "user"), None)
    if not isinstance(content, str):
        raise ValueError("no user message with text content")
    return content[len(USER):] if content.startswith(USER) else content


def continuation_span(given: str, answer: str) -> tuple[int, int, list[str]]:
    """(start, end, notes): ``answer[start:end]`` is the continuation of ``given``.

    - Fences: the first fenced block's content (its opening line, ```` ```python ````, dropped)
      up to its closing fence, or to the end when the answer was cut before it; text before the
      fence is prose.
    - A repeat: the block opens with the given text, or with its last lines (a model that writes
      the function out again from its signature), the last given line possibly cut mid-way (a
      probe's cut falls inside a line): the continuation starts where the repeat ends.
    """
    notes: list[str] = []
    start, end = 0, len(answer)
    fence = answer.find("```")
    if fence >= 0:
        notes.append(FENCED)
        if answer[:fence].strip():
            notes.append(PROSE)
        line_end = answer.find("\n", fence)
        start = end if line_end < 0 else line_end + 1
        close = answer.find("```", start)
        if close >= 0:
            # the newline before the closing fence belongs to the fence, not to the code
            end = close - 1 if close > start and answer[close - 1] == "\n" else close
    repeat = _repeat_length(given, answer[start:end])
    if repeat:
        notes.append(REPEATED)
        start += repeat
    return start, end, notes


def _repeat_length(given: str, code: str) -> int:
    """How many characters at the start of ``code`` repeat the end of ``given`` (0: none)."""
    glines = given.split("\n")
    clines = code.split("\n")
    # a suffix of the given lines, from line o (0: the whole text): every line but the last equal up
    # to trailing spaces, the last (where the given text stops) a prefix of the code's line
    for o in range(len(glines)):
        tail = glines[o:]
        if len("".join(tail).strip()) < _MIN_REPEAT or len(clines) < len(tail):
            continue
        if all(c.rstrip() == g.rstrip() for c, g in zip(clines, tail[:-1])) \
                and clines[len(tail) - 1].startswith(tail[-1]):
            return sum(len(line) + 1 for line in clines[:len(tail) - 1]) + len(tail[-1])
    return 0


def token_logprobs(choice: dict) -> tuple[list, list[int]] | None:
    """A chat choice's (log-probs, start offsets in its message content) from
    ``logprobs.content`` (each token's ``token`` and ``logprob``), or None without them."""
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if content is None:
        return None
    if not isinstance(content, list) or not all(isinstance(t, dict) and isinstance(t.get("token"), str)
                                                and isinstance(t.get("logprob"), (int, float)) for t in content):
        raise ValueError("chat logprobs without token and logprob")
    offsets, at = [], 0
    for t in content:  # offsets from the token strings: exact where they spell the content out
        offsets.append(at)
        at += len(t["token"])
    return [float(t["logprob"]) for t in content], offsets


def covering(offsets: list[int], start: int, end: int, total: int) -> list[int]:
    """Indices of the tokens that overlap ``[start, end)`` of a text ``total`` characters long (at
    least the first one from ``start``: an answer that ends at once has a probability too)."""
    ends = offsets[1:] + [total]
    picked = [j for j, (a, b) in enumerate(zip(offsets, ends)) if a < end and b > start]
    if not picked:
        first = next((j for j, a in enumerate(offsets) if a >= start), None)
        picked = [] if first is None else [first]
    return picked
