"""`mini-gpt serve`'s OpenAI-compatible API, driven by the official `openai` client and plain HTTP against a
real uvicorn server (in a thread of this process, on a free port): the text `mini-gpt generate` gives for
the same seed and settings, streaming, logprobs, one-sentence errors, disconnects, the API key, 16 clients
at once for a while (MINI_GPT_SERVE_LOAD_S seconds) and a stream that Ctrl-C cuts short."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import openai
import pytest
import torch
import uvicorn
from helpers import REPO, write_lightning_ckpt

from mini_gpt.cli.generate import run as generate_cli
from mini_gpt.cli.serve import build
from mini_gpt.conf.tools import GenerateConfig, ServeConfig
from mini_gpt.errors import MiniGPTError
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.serve.app import SHUTTING_DOWN
from mini_gpt.tokenizer import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # tiny Shakespeare's 65
KEY = "sk-mini-gpt-test-key"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=len(CHARS), block_size=32))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)  # spread the logits: samples differ from seed to seed
    return write_lightning_ckpt(tmp_path_factory.mktemp("serve") / "last.ckpt", model, CharTokenizer(CHARS))


def import_anyio_now() -> None:
    """Import the parts of anyio it imports on first use (anyio._lazyimport), here in the test's thread.

    pytest rewrites anyio's modules as they are imported (anyio is a pytest plugin), with `ast`, which is
    not thread-safe in CPython 3.11: a server thread's first `anyio.open_file` (a FileResponse) beside the
    test's own parsing failed once in CI with "SystemError: AST constructor recursion depth mismatch".
    A served app outside pytest loads compiled modules and never meets this."""
    for name, module in list(sys.modules.items()):
        if name == "anyio" or name.startswith("anyio."):
            for attribute in dir(module):  # a lazy module lists its lazy names, and getattr imports them
                getattr(module, attribute, None)


@contextmanager
def serving(app):
    """The base URL of `app` served by uvicorn in a thread, on a free port."""
    import_anyio_now()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)
        app.state.engine.close()


@pytest.fixture(scope="module")
def server(ckpt):
    """(base URL, the app) of a server on a free port; max_tokens raised so a disconnect lands mid-run."""
    app = build(ServeConfig(ckpt=str(ckpt), device="cpu", model_name="tiny", max_tokens=50_000))
    with serving(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def keyed(ckpt):
    """The base URL of a server with an API key."""
    app = build(ServeConfig(ckpt=str(ckpt), device="cpu", model_name="tiny", max_tokens=50_000, api_key=KEY))
    with serving(app) as url:
        yield url


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=30)


def cli_text(ckpt, prompt: str, **kw) -> list[str]:
    """What `mini-gpt generate` writes for these settings (its own code path, in this process)."""
    records = generate_cli(
        GenerateConfig(ckpt=str(ckpt), prompt=prompt, device="cpu", **kw),
        out=io.StringIO(),
        err=io.StringIO(),
    )
    return [r["sample"] for r in records]


def test_models_and_health(server, client) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    health = httpx.get(server[0] + "/health").json()
    assert health == {"status": "ok", "model": "tiny", "waiting": 0}


def test_completion_is_generates_text(ckpt, client) -> None:
    settings = {"temperature": 0.9, "top_p": 0.9, "seed": 11}
    got = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=40, **settings)
    expected = cli_text(ckpt, "ROMEO:", max_new_tokens=40, top_k=None, **settings)
    assert [c.text for c in got.choices] == expected
    assert got.choices[0].finish_reason == "length"
    assert got.usage.prompt_tokens == 6 and got.usage.completion_tokens == 40

    several = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=20, n=3, seed=4,
                                        extra_body={"top_k": 30})  # fmt: skip
    expected = cli_text(ckpt, "ROMEO:", max_new_tokens=20, num_samples=3, temperature=1.0, top_k=30, seed=4)
    assert [c.text for c in several.choices] == expected
    assert len(set(expected)) == 3  # the samples differ: n really samples n times


def test_stream_equals_the_whole_answer(client) -> None:
    kw = {"model": "tiny", "prompt": "To be", "max_tokens": 30, "seed": 2, "logprobs": 3}
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    streamed = [lp for c in chunks if c.choices[0].logprobs for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(whole.choices[0].logprobs.token_logprobs)
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == whole.choices[0].logprobs.text_offset
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == 30 and "".join(lp.tokens) == whole.choices[0].text
    assert lp.text_offset == list(range(30))  # one character per token
    for _token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and logprob < 0
        assert max(top.values()) >= logprob - 1e-6  # the best alternatives include anything better


def test_stream_of_several_samples(client) -> None:
    kw = {"model": "tiny", "prompt": "To be", "max_tokens": 25, "seed": 6, "n": 3}
    whole = [c.text for c in client.completions.create(**kw).choices]
    streamed = ["", "", ""]
    finish = {}
    for chunk in client.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert streamed == whole and len(set(whole)) == 3
    assert finish == {0: "length", 1: "length", 2: "length"}


def test_greedy_logprobs_top_is_the_chosen_token(client) -> None:
    got = client.completions.create(model="tiny", prompt="a", max_tokens=10, temperature=0, logprobs=1)
    lp = got.choices[0].logprobs
    assert [list(t) for t in lp.top_logprobs] == [[tok] for tok in lp.tokens]


def test_stop_strings(client) -> None:
    free = client.completions.create(model="tiny", prompt="a", max_tokens=40, seed=9).choices[0].text
    stop = free[20:22]
    for stream in (False, True):
        got = client.completions.create(model="tiny", prompt="a", max_tokens=40, seed=9, stop=[stop, "QQQ"],
                                        stream=stream)  # fmt: skip
        if stream:
            chunks = list(got)
            text, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            text, finish = got.choices[0].text, got.choices[0].finish_reason
        assert text == free[: free.index(stop)] and finish == "stop"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": "a", "max_tokens": 60_000}, 400, "max_tokens must be between 1 and 50000."),
        ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens must be between 1 and 50000."),
        ({"prompt": "a", "n": 9}, 400, "n must be between 1 and 8."),
        ({"prompt": "a", "logprobs": 6}, 400, "logprobs must be between 0 and 5."),
        ({"prompt": "a", "top_p": 0}, 400, "top_p=0.0 must be in (0, 1] or null."),
        ({"prompt": "a", "temperature": -1}, 400, "temperature=-1.0 must be >= 0 (0 = greedy)."),
        ({"prompt": "a", "stop": ["1", "2", "3", "4", "5"]}, 400, "stop may hold at most 4 strings."),
        ({"prompt": "a", "echo": True}, 400, "echo is not supported."),
        ({"prompt": "€uro"}, 400, None),
        ({"prompt": [1, 999]}, 400, "prompt token ids must be 0..64 and not empty, got [999]."),
        ({"prompt": ["a", "b"]}, 400, "Send one prompt per request (a list of several is not supported)."),
        ({"prompt": "a", "model": "gpt-4"}, 404, "The model 'gpt-4' does not exist; this server has 'tiny'."),
        (
            {"prompt": "a", "max_tokens": "5"},
            422,
            "Field 'max_tokens' is invalid: input should be a valid integer.",
        ),
        (
            {"prompt": "a", "stream": "yes"},
            422,
            "Field 'stream' is invalid: input should be a valid boolean.",
        ),
        ({"prompt": {"text": "a"}}, 422, None),
        ([1, 2], 422, "The request body must be a JSON object."),
    ],
)
def test_bad_requests_get_one_sentence(server, body, status, message) -> None:
    response = httpx.post(server[0] + "/v1/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    text = error["message"]
    assert "\n" not in text and "Traceback" not in text and text.endswith(".") and text.count(". ") == 0
    if message is not None:
        assert text == message
    if body == {"prompt": "€uro"}:
        assert "€" in text and error["param"] == "prompt"


def test_bad_json_routes_and_methods(server) -> None:
    url = server[0]
    bad = httpx.post(
        url + "/v1/completions", content=b'{"prompt": "a",', headers={"content-type": "application/json"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "The request body is not valid JSON."
    assert httpx.get(url + "/v1/nothing").json()["error"]["message"] == "No route /v1/nothing."
    assert httpx.get(url + "/v1/completions").status_code == 405
    with pytest.raises(openai.BadRequestError, match="max_tokens must be between"):
        openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).completions.create(
            model="tiny", prompt="a", max_tokens=10**6
        )


def test_a_client_that_disconnects_stops_its_generation(server) -> None:
    url, app = server
    engine = app.state.engine
    jobs = []
    submit = engine.submit
    engine.submit = lambda job: (jobs.append(job), submit(job))[1]
    try:
        body = {"prompt": "a", "max_tokens": 50_000, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
    finally:
        engine.submit = submit
    deadline = time.monotonic() + 10
    while engine.waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    [job] = jobs
    assert engine.waiting == 0 and job.cancel.is_set()
    assert 1 <= job.streams[0].tokens < 50_000  # stopped early, not run to the end


def test_sixteen_clients_streaming_for_a_while_each_get_their_own_answer(keyed) -> None:
    """A load test: 16 clients stream one after another for MINI_GPT_SERVE_LOAD_S seconds (3 here; the
    one-minute run of docs/serve.md sets 60), each always its own seed; every stream must be complete and
    the text its seed gives alone, before the load, so that no client ever gets another's tokens."""
    seconds = float(os.environ.get("MINI_GPT_SERVE_LOAD_S", "3"))
    clients, tokens = 16, 64

    def client() -> openai.OpenAI:
        return openai.OpenAI(base_url=keyed + "/v1", api_key=KEY, max_retries=0, timeout=60)

    kw = {"model": "tiny", "prompt": "ROMEO:", "max_tokens": tokens}
    alone = [client().completions.create(seed=seed, **kw).choices[0].text for seed in range(clients)]
    assert len(set(alone)) == clients and all(len(text) == tokens for text in alone)

    def ask(seed: int) -> list[tuple[str, str | None, float]]:
        api, results = client(), []
        end = time.monotonic() + seconds
        while not results or time.monotonic() < end:
            t0 = time.perf_counter()
            chunks = list(api.completions.create(seed=seed, stream=True, **kw))
            text = "".join(c.choices[0].text for c in chunks)
            results.append((text, chunks[-1].choices[0].finish_reason, time.perf_counter() - t0))
        return results

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        runs = list(pool.map(ask, range(clients)))
    wall = time.perf_counter() - t0
    for seed, results in enumerate(runs):
        for text, finish, _ in results:
            assert (text, finish) == (alone[seed], "length")  # complete, and its own seed's text
    latencies = sorted(s for results in runs for _, _, s in results)
    streams = len(latencies)
    print(
        f"\n{clients} clients x {seconds:g} s: {streams} streams ({streams * tokens} tokens) in "
        f"{wall:.1f} s, {streams * tokens / wall:.0f} tokens/s; per stream median "
        f"{latencies[streams // 2]:.2f} s, max {latencies[-1]:.2f} s"
    )
    assert latencies[-1] < 30  # nobody starves


def test_busy_server_answers_429(ckpt) -> None:
    from fastapi.testclient import TestClient

    app = build(ServeConfig(ckpt=str(ckpt), device="cpu", max_waiting=1))
    engine = app.state.engine
    try:
        engine.waiting = 1  # as if one request were running
        with TestClient(app) as http:
            response = http.post("/v1/completions", json={"prompt": "a"})
            assert response.status_code == 429
            assert (
                response.json()["error"]["message"]
                == "The server is busy (1 requests waiting); try again soon."
            )
            engine.waiting = 0
            assert http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200
            assert json.loads(http.get("/health").text)["model"] == ckpt.parent.name
    finally:
        engine.close()


def test_cli_errors_are_one_line(ckpt, capsys) -> None:
    import socket

    from mini_gpt.cli.serve import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main([f"ckpt={ckpt}", f"port={port}", "device=cpu", "log_level=critical"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    expected = f"error: could not serve on 127.0.0.1:{port} (is the port in use? try port=8001)"
    assert err.splitlines()[-1] == expected
    with pytest.raises(SystemExit):
        main(["port=70000"])
    assert capsys.readouterr().err == "error: port=70000 must be at most 65535\n"


def test_bench_section_times_the_same_text(server, ckpt) -> None:
    from mini_gpt.bench.serve import measure

    rows = measure(server[0], ckpt, tokens=12, repeats=2, threads=1)
    assert [r["contender"] for r in rows] == ["generate", "serve-stream"]
    assert all(r["same_text"] for r in rows)  # the stream is generate's text for the same seed
    generate, stream = rows
    assert generate["first_token_s"] is None and generate["vs_generate"] == 1.0
    assert 0 < stream["first_token_s"] <= stream["median_s"]
    assert stream["tokens_per_s"] == pytest.approx(12 / stream["median_s"], rel=0.5)


def saved_model(ckpt) -> GPT:
    """The served weights, read back from the checkpoint by hand (not by mini-gpt's loader)."""
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**saved["mini_gpt"]["model_config"]))
    model.load_state_dict({k.removeprefix("model."): v for k, v in saved["state_dict"].items()})
    return model.eval()


@torch.no_grad()
def reference_lens(model: GPT, ids: list[int]) -> torch.Tensor:
    """(n_layer + 1, T, vocab): softmax(ln_f(h_l) @ W_out^T) for the residual stream h_l entering block l
    (l = n_layer: the final norm), captured by hooks written here."""
    stream = []
    modules = [*model.transformer.h, model.transformer.ln_f]
    hooks = [m.register_forward_pre_hook(lambda m, args: stream.append(args[0][0])) for m in modules]
    try:
        logits, _ = model(torch.tensor([ids]))
    finally:
        for hook in hooks:
            hook.remove()
    probs = torch.stack(
        [torch.softmax(model.transformer.ln_f(h) @ model.lm_head.weight.T, -1) for h in stream]
    )
    assert torch.allclose(probs[-1], logits[0].softmax(-1), atol=1e-6)  # the last depth is the model's own
    return probs


def assert_lens_entry(entry: dict, probs: torch.Tensor, position: int, following: int | None, k: int) -> None:
    """One position of /api/lens against the reference distribution probs (n_layer + 1, vocab) there."""
    assert len(entry["layers"]) == probs.shape[0]
    assert entry["position"] == position
    assert entry["next"] == (None if following is None else {"id": following, "text": CHARS[following]})
    for got, p in zip(entry["layers"], probs, strict=True):
        best, best_ids = p.topk(k)
        assert [t["id"] for t in got["top"]] == best_ids.tolist()
        assert [t["text"] for t in got["top"]] == [CHARS[i] for i in best_ids.tolist()]
        assert [t["prob"] for t in got["top"]] == pytest.approx(best.tolist(), abs=2e-5)
        if following is None:
            assert got["next_prob"] is None
        else:
            assert got["next_prob"] == pytest.approx(float(p[following]), abs=2e-5)


def test_lens_is_every_depth_through_the_final_norm_and_head(server, ckpt) -> None:
    url = server[0]
    model = saved_model(ckpt)
    text = "ROMEO: to be"
    ids = [CHARS.index(c) for c in text]
    got = httpx.post(url + "/api/lens", json={"text": text, "top_k": 4}).json()
    assert got["depths"] == ["embedding", "block 0", "block 1"] and got["start"] == 0
    probs = reference_lens(model, ids)  # (3, T, vocab)
    assert [e["text"] for e in got["positions"]] == list(text)
    for p, entry in enumerate(got["positions"]):
        assert_lens_entry(entry, probs[:, p], p, ids[p + 1] if p + 1 < len(ids) else None, 4)
    assert httpx.post(url + "/api/lens", json={"ids": ids, "top_k": 4}).json() == got  # ids = the text

    # One position of a text longer than the context: the block_size tokens ending there, as generation
    long = [CHARS.index(c) for c in "First Citizen: Before we proceed any further, hear me speak."]
    assert len(long) > 32 + 10
    for position in (40, len(long) - 1, 3):
        one = httpx.post(url + "/api/lens", json={"ids": long, "position": position, "top_k": 20}).json()
        start = max(0, position + 1 - 32)
        assert one["start"] == start and len(one["positions"]) == 1
        window = reference_lens(model, long[start : position + 1])
        following = long[position + 1] if position + 1 < len(long) else None
        assert_lens_entry(one["positions"][0], window[:, -1], position, following, 20)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": "x" * 33}, "The text has 33 tokens, more than the model's context of 32; send a "
                             "position to read one token of a longer text."),
        ({"text": "a", "top_k": 0}, "top_k must be between 1 and 20."),
        ({"text": "a", "top_k": 21}, "top_k must be between 1 and 20."),
        ({"text": "a", "ids": [1]}, "Send text or ids (its token ids): one of the two."),
        ({"top_k": 3}, "Send text or ids (its token ids): one of the two."),
        ({"ids": [1, 2], "position": 2}, "position=2 is outside the 2 tokens."),
        ({"ids": [1, 2], "position": -1}, "position=-1 is outside the 2 tokens."),
        ({"ids": [1, 65]}, "prompt token ids must be 0..64 and not empty, got [65]."),
        ({"text": "€"}, None),
        ({"ids": [1] * 60_000, "position": 3}, "Too many tokens for one logit lens."),
    ],
)  # fmt: skip
def test_lens_bad_input_is_400_with_one_sentence(server, body, message) -> None:
    response = httpx.post(server[0] + "/api/lens", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    text = error["message"]
    assert "\n" not in text and "Traceback" not in text and text.endswith(".") and text.count(". ") == 0
    assert text == message if message is not None else "€" in text


def test_heads_are_the_role_definitions_on_a_repeated_sequence(server, ckpt, monkeypatch) -> None:
    """Each score from its definition, with plain loops over the attention weights of the model's exact
    attention path on 8 sequences of 16 random tokens (seed 0), each repeated; then kept, not recomputed."""
    url = server[0]
    got = httpx.get(url + "/api/heads").json()
    half = 16  # the context (32) holds two copies
    assert (got["half"], got["sequences"], got["seed"]) == (half, 8, 0)
    first = torch.randint(len(CHARS), (8, half), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        att = saved_model(ckpt).attention_weights(torch.cat([first, first], dim=1))  # n_layer x (8, nh, T, T)
    T, second = 2 * half, range(half, 2 * half)  # the second copy's queries

    def mean_on(a: torch.Tensor, key_offset: int, queries: range) -> float:  # query t's weight on t - offset
        return sum(float(a[b, t, t - key_offset]) for b in range(8) for t in queries) / (8 * len(queries))

    for layer in range(2):
        for head in range(2):
            a = att[layer][:, head]  # (8, T, T)
            scores = {
                "previous_token": mean_on(a, 1, range(1, T)),
                "induction": mean_on(a, half - 1, second),  # the token after the earlier occurrence
                "duplicate_token": mean_on(a, half, second),  # the earlier occurrence
            }
            for role, score in scores.items():
                assert got["roles"][role][layer][head] == pytest.approx(score, abs=2e-5), (role, layer, head)

    import mini_gpt.serve.engine

    monkeypatch.setattr(mini_gpt.serve.engine, "head_roles", lambda *a, **kw: pytest.fail("computed again"))
    assert httpx.get(url + "/api/heads").json() == got


def test_a_lens_waits_for_the_running_generation(server) -> None:
    """The model runs one thing at a time: a logit lens asked for while a completion streams is computed
    after it (here: when its client leaves), and is the lens asked for alone."""
    url, _ = server
    body = {"text": "ROMEO: to be", "top_k": 5}
    alone = httpx.post(url + "/api/lens", json=body).json()
    with ThreadPoolExecutor(3) as pool:
        generation = {"prompt": "a", "max_tokens": 50_000, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=generation) as response:
            lines = response.iter_lines()  # kept: a closed iterator closes the stream
            assert next(line for line in lines if line.startswith("data: "))
            waiting = [pool.submit(httpx.post, url + "/api/lens", json=body, timeout=60) for _ in range(3)]
            time.sleep(1.0)
            assert not any(f.done() for f in waiting)  # they wait for the generation
        assert [f.result().json() for f in waiting] == [alone] * 3


def test_with_an_api_key_every_api_route_needs_it(keyed, server) -> None:
    for path in ("/", "/static/app.js", "/health"):  # the page loads (then asks for the key)
        assert httpx.get(keyed + path).status_code == 200, path
    routes = [("GET", "/v1/models", None), ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}),
              ("GET", "/api/info", None), ("POST", "/api/generate", {"prompt": "a", "max_tokens": 2}),
              ("POST", "/api/attention", {"ids": [1, 2], "position": 1}),
              ("POST", "/api/lens", {"text": "To be", "top_k": 3}), ("GET", "/api/heads", None),
              ("GET", "/v1/nothing", None), ("GET", "//v1/models", None)]  # fmt: skip
    missing = "Missing API key: send it as the header Authorization: Bearer <key>."
    for headers, message in [
        ({}, missing),
        ({"Authorization": "Bearer wrong"}, "Incorrect API key provided."),
        ({"Authorization": f"Bearer {KEY}x"}, "Incorrect API key provided."),
        ({"Authorization": f"Basic {KEY}"}, "Incorrect API key provided."),
        ({"Authorization": ""}, missing),
    ]:
        for method, path, body in routes:
            response = httpx.request(method, keyed + path, json=body, headers=headers)
            assert response.status_code == 401, (path, headers)
            assert response.json() == {  # OpenAI's body
                "error": {"message": message, "type": "invalid_request_error", "param": None,
                          "code": "invalid_api_key"}
            }  # fmt: skip
    for method, path, body in routes[:-2]:  # with the key: what the server without one answers
        got = httpx.request(method, keyed + path, json=body, headers={"Authorization": f"bearer {KEY}"})
        want = httpx.request(method, server[0] + path, json=body)
        assert got.status_code == want.status_code == 200, path
        if path.startswith("/api/"):
            assert got.text == want.text, path

    with pytest.raises(openai.AuthenticationError, match="Incorrect API key provided"):
        openai.OpenAI(base_url=keyed + "/v1", api_key="wrong", max_retries=0).models.list()
    keyed_client = openai.OpenAI(base_url=keyed + "/v1", api_key=KEY, max_retries=0)
    plain_client = openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0)
    kw = {"model": "tiny", "prompt": "ROMEO:", "max_tokens": 20, "seed": 3}
    texts = [api.completions.create(**kw).choices[0].text for api in (keyed_client, plain_client)]
    assert texts[0] == texts[1]


def test_api_key_settings(monkeypatch) -> None:
    monkeypatch.delenv("MINI_GPT_API_KEY", raising=False)
    with pytest.raises(MiniGPTError) as refused:
        ServeConfig(host="0.0.0.0")
    assert str(refused.value) == (
        "host=0.0.0.0 lets anyone who reaches port 8000 use the model: set api_key=KEY "
        "(or MINI_GPT_API_KEY), or allow_unauthenticated=true"
    )
    assert ServeConfig(host="0.0.0.0", allow_unauthenticated=True).api_key is None
    assert ServeConfig(host="::1").api_key is None and ServeConfig(host="localhost").api_key is None
    assert ServeConfig(host="0.0.0.0", api_key="k1").api_key == "k1"
    monkeypatch.setenv("MINI_GPT_API_KEY", "from-env")
    assert ServeConfig(host="0.0.0.0").api_key == "from-env"
    assert ServeConfig(api_key="given").api_key == "given"  # the key= setting wins
    with pytest.raises(MiniGPTError, match="api_key must be printable ASCII without spaces"):
        ServeConfig(api_key="two words")


def test_host_without_a_key_is_one_line(capsys, monkeypatch) -> None:
    from mini_gpt.cli.serve import main

    monkeypatch.delenv("MINI_GPT_API_KEY", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["host=0.0.0.0", "port=8123"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "error: host=0.0.0.0 lets anyone who reaches port 8123 use the model: set api_key=KEY "
        "(or MINI_GPT_API_KEY), or allow_unauthenticated=true\n"
    )


def test_ctrl_c_ends_open_streams_with_an_error_not_a_finish_reason(ckpt) -> None:
    """`mini-gpt serve` in its own process, Ctrl-C while a long completion streams: the stream ends with an
    error event (the official client raises it), and no chunk claims the length was reached."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mini_gpt.cli", "serve", f"ckpt={ckpt}", f"port={port}", "device=cpu",
         "max_tokens=50000", "model_name=tiny"],
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a busy 2-core machine took 99 s once
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "mini-gpt serve did not answer /health within 120 s"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        body = {"prompt": "a", "max_tokens": 50_000, "stream": True}
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 3:
                        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and err.rstrip().endswith("mini-gpt serve: stopped"), err
    chunks = [json.loads(e) for e in events]
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    assert 3 <= len(text) < 50_000  # cut short
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    error = {"message": SHUTTING_DOWN, "type": "server_error", "param": None, "code": "server_shutting_down"}
    assert chunks[-1] == {"error": error}
    # the official client raises it instead of ending the iteration as if the completion were whole
    stream = openai.Stream(cast_to=openai.types.Completion, response=httpx.Response(
        200, content="".join(f"data: {e}\n\n" for e in events).encode(), request=httpx.Request("POST", url)),
        client=openai.OpenAI(base_url=url, api_key="x"))  # fmt: skip
    with pytest.raises(openai.APIError, match="The server is shutting down"):
        list(stream)
