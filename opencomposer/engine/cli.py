"""`opencomposer serve`: the inference server (server.py) on a checkpoint directory.

    opencomposer serve --model DIR [--port 30000] [--host 127.0.0.1] [--max-slots 32]
                       [--max-len 4096] [--speculative-depth 0] [--dtype float32] [--threads N]
    opencomposer serve --backend vllm --model DIR [--port P] [--dtype float32|bfloat16]
                       [--max-len N] [--max-slots N] [--chat-tools] [--kv-cache-gib 1]

`--backend vllm` serves DIR with vLLM (its own venv, `make setup-vllm`) on 127.0.0.1:P, OpenAI's
/v1/completions and /v1/chat/completions, until it is stopped (Ctrl-C or SIGTERM), and stops vLLM's
processes with it (engine/vllm_server.py); its log is under --log-dir (default: DIR/../vllm-logs).

DIR is an HF-format checkpoint (config.json + safetensors, `opencomposer.model.save_pretrained`
or transformers'); its tokenizer.json is used when present, else the bundled tokenizer. The
port defaults to SGLang's (30000), so SGLang clients work unchanged; the host to 127.0.0.1
(no authentication: expose it only behind something that adds it). Ctrl-C stops it.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False)

_DTYPES = ("float32", "bfloat16", "float16")


@app.command("serve")
def serve(
    model: Path = typer.Option(..., "--model", exists=True, file_okay=False, resolve_path=True,
                               help="HF-format checkpoint directory (config.json + safetensors)."),
    port: int = typer.Option(30000, "--port", help="TCP port."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; 127.0.0.1 keeps it local."),
    max_slots: int = typer.Option(32, "--max-slots", help="Sequences decoded together (KV cache slots)."),
    max_len: int = typer.Option(None, "--max-len",
                                help="Context per sequence, prompt + output "
                                     "(default: the smaller of 4096 and max_position_embeddings)."),
    speculative_depth: int = typer.Option(0, "--speculative-depth",
                                          help="MTP draft tokens per step (0: plain decoding)."),
    dtype: str = typer.Option(None, "--dtype", help=f"One of {', '.join(_DTYPES)} (default: the checkpoint's)."),
    threads: int = typer.Option(None, "--threads", help="torch intra-op threads (default: torch's)."),
    name: str = typer.Option(None, "--name", help="Model name in /v1/models (default: the directory name)."),
    backend: str = typer.Option("embedded", "--backend", help="embedded (opencomposer's engine) or vllm."),
    chat_tools: bool = typer.Option(False, "--chat-tools",
                                    help="vllm: tool calls on /v1/chat/completions (opencomposer's parser plugin)."),
    kv_cache_gib: float = typer.Option(1.0, "--kv-cache-gib", help="vllm: KV cache size in GiB."),
    log_dir: Path = typer.Option(None, "--log-dir", help="vllm: where its logs go (default: DIR/../vllm-logs)."),
) -> None:
    """Serve a checkpoint: SGLang's /generate, OpenAI's /v1/chat/completions and /v1/completions."""
    if backend not in ("embedded", "vllm"):
        raise typer.BadParameter(f"{backend!r} is not one of embedded, vllm", param_hint="--backend")
    if backend == "vllm":
        _serve_vllm(model, port, host, dtype, max_len, max_slots, name, chat_tools, kv_cache_gib, log_dir)
        return
    import torch
    import uvicorn

    from opencomposer.engine.engine import Engine
    from opencomposer.engine.server import create_app
    from opencomposer.errors import OpenComposerError
    from opencomposer.model import load_pretrained
    from opencomposer.model.export import check_tokenizer
    from opencomposer.model.tokenizer import load_tokenizer

    if dtype is not None and dtype not in _DTYPES:
        raise typer.BadParameter(f"{dtype!r} is not one of {', '.join(_DTYPES)}", param_hint="--dtype")
    try:
        net = load_pretrained(model, dtype=getattr(torch, dtype) if dtype else None)
        tok = load_tokenizer(checkpoint=model)
        check_tokenizer(tok, net.config, model)  # vocabulary size, the chat format's tokens
        context = max_len or min(4096, net.config.max_position_embeddings)
        engine = Engine(net, max_slots=max_slots, max_len=context, speculative_depth=speculative_depth,
                        num_threads=threads)
    except (OpenComposerError, ValueError) as exc:
        typer.echo(f"serve: {exc}", err=True)
        raise typer.Exit(1)
    api = create_app(engine, tok, max_len=engine.max_len, vocab_size=engine.vocab_size,
                     model_name=name or model.name, update_from_disk=engine.update_weights_from_disk)
    engine.start()
    try:
        uvicorn.run(api, host=host, port=port, log_level="info")
    finally:
        engine.stop()


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _serve_vllm(model: Path, port: int, host: str, dtype: str | None, max_len: int | None, max_slots: int,
                name: str | None, chat_tools: bool, kv_cache_gib: float, log_dir: Path | None) -> None:
    import signal
    import time

    from opencomposer.engine.vllm_server import VLLMConfig, VLLMError, VLLMServer

    if host != "127.0.0.1":
        raise typer.BadParameter("vLLM is served on 127.0.0.1 only", param_hint="--host")
    if dtype not in (None, "float32", "bfloat16"):
        raise typer.BadParameter(f"{dtype!r} is not one of float32, bfloat16", param_hint="--dtype")
    cfg = VLLMConfig(port=port, dtype=dtype or "float32", max_num_seqs=max_slots, chat_tools=chat_tools,
                     kv_cache_gib=kv_cache_gib, served_model_name=name or model.name)
    server = VLLMServer(cfg, model, log_dir=log_dir or model.parent / "vllm-logs", max_model_len=max_len)
    signal.signal(signal.SIGTERM, _interrupt)  # stop as Ctrl-C does: vLLM's group is ended in finally
    try:
        typer.echo(f"serve: starting vLLM on {model} (log: {server.log_path.parent})", err=True)
        server.start()
        typer.echo(f"serve: vLLM serves {model} as {cfg.served_model_name!r} at {server.url} "
                   f"(started in {server.started_s:.0f} s); Ctrl-C stops it", err=True)
        while server.alive():
            time.sleep(1.0)
        typer.echo(f"serve: vLLM exited; see {server.log_path}", err=True)
        raise typer.Exit(1)
    except VLLMError as exc:
        typer.echo(f"serve: {exc}", err=True)
        raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    app()
