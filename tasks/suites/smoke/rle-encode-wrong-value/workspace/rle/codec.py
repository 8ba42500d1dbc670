"""Run-length encoding of strings without digits: "aaab" <-> "3a1b"."""


def encode(text):
    """Encode each run as its length followed by the character ("aaab" -> "3a1b")."""
    out = []
    i = 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(f"{j - i - 1}{text[i]}")
        i = j
    return "".join(out)


def decode(code):
    """Inverse of encode ("3a1b" -> "aaab"); counts may have several digits."""
    out = []
    count = ""
    for ch in code:
        if ch.isdigit():
            count += ch
        else:
            out.append(ch * int(count))
            count = ""
    return "".join(out)
