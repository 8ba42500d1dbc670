from textkit.slug import camel_to_snake, slugify


def test_camel_to_snake():
    assert camel_to_snake("CamelCase") == "camel_case"
    assert camel_to_snake("camelCase") == "camel_case"
    assert camel_to_snake("HTTPServer") == "http_server"
    assert camel_to_snake("getHTTPResponseCode") == "get_http_response_code"
    assert camel_to_snake("simple") == "simple"
