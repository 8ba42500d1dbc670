from textkit.words import count_words, top_words, words


def test_words():
    assert words("Hello, World!") == ["hello", "world"]
    assert words("It's 2 o'clock") == ["it's", "2", "o'clock"]
    assert words("") == []


def test_count_words():
    assert count_words("the cat and the hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}
    assert count_words("A a A") == {"a": 3}
    assert count_words("") == {}


def test_top_words():
    text = "b a c b a b d"
    assert top_words(text, 2) == [("b", 3), ("a", 2)]
    assert top_words(text, 4) == [("b", 3), ("a", 2), ("c", 1), ("d", 1)]
    assert top_words("x y z", 0) == []
