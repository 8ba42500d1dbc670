from rle.codec import decode, encode


def test_decode():
    assert decode("3a1b") == "aaab"
    assert decode("1a1b1c") == "abc"
    assert decode("12z") == "z" * 12
    assert decode("") == ""
