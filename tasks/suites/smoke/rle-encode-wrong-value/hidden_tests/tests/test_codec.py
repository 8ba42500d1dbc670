from rle.codec import decode, encode


def test_encode():
    assert encode("aaab") == "3a1b"
    assert encode("abc") == "1a1b1c"
    assert encode("z" * 12) == "12z"
    assert encode("") == ""


def test_decode():
    assert decode("3a1b") == "aaab"
    assert decode("1a1b1c") == "abc"
    assert decode("12z") == "z" * 12
    assert decode("") == ""


def test_round_trip():
    for text in ["hello", "aaaaaaaaaaaaaaabbb", "x", "mississippi"]:
        assert decode(encode(text)) == text
