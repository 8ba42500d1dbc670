"""Chat formats, one module per family: base.py (the Protocol, the data, the shared machinery),
opencomposer.py, chatml.py (qwen3, qwen3_coder), template.py (the Jinja helpers). model/chat.py
holds the registry; docs/chat-formats.md describes them."""
