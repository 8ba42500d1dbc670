from textkit.slug import camel_to_snake, slugify


def test_slugify():
    assert slugify("Hello World") == "hello-world"
    assert slugify("  Hello, World!  ") == "hello-world"
    assert slugify("a--b__c") == "a-b-c"
    assert slugify("Python 3.11") == "python-3-11"


def test_camel_to_snake():
    assert camel_to_snake("CamelCase") == "camel_case"
    assert camel_to_snake("camelCase") == "camel_case"
    assert camel_to_snake("HTTPServer") == "http_server"
    assert camel_to_snake("getHTTPResponseCode") == "get_http_response_code"
    assert camel_to_snake("simple") == "simple"
