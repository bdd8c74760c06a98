"""The playground as a person uses it: `mini-gpt serve` in its own process, the page in a real headless
Chromium (Playwright's Python API driving Debian's `chromium`: docs/development.md), with an API key. Give
the key when the page asks (once), type a prompt, click Generate, read the streamed text (it must be
`mini-gpt generate`'s greedy output), hover a token for its alternatives, click one for the attention view,
save a screenshot, and stop the server with Ctrl-C."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers import REPO, train_tiny_char_model, write_lightning_ckpt
from playwright.sync_api import expect, sync_playwright

from mini_gpt.cli.generate import run as generate_cli
from mini_gpt.conf.tools import GenerateConfig

PROMPT = "ROMEO:\nWhat"
KEY = "sk-e2e-page-key"
NEW_TOKENS = 60


def browser_path() -> str:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.fail("no chromium on the PATH: apt-get install -y chromium (see docs/development.md)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def served(tmp_path: Path):
    """A trained tiny char model served by `mini-gpt serve` in a subprocess, its API key given by the
    environment: (url, ckpt, process)."""
    model, tokenizer, _ = train_tiny_char_model(steps=300)  # ~3 s: greedy text of words, not spaces
    ckpt = write_lightning_ckpt(tmp_path / "last.ckpt", model, tokenizer)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mini_gpt.cli", "serve", f"ckpt={ckpt}", f"port={port}", "device=cpu",
         "model_name=tiny-shakespeare-char"],
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MINI_GPT_API_KEY": KEY},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "mini-gpt serve did not answer /health within 60 s"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    try:
        yield url, ckpt, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_page_streams_shades_explains_and_stops_cleanly(served, tmp_path: Path) -> None:
    url, ckpt, proc = served
    records = generate_cli(
        GenerateConfig(ckpt=str(ckpt), prompt=PROMPT, max_new_tokens=NEW_TOKENS, temperature=0, device="cpu"),
        out=io.StringIO(), err=io.StringIO(),
    )  # fmt: skip
    expected = PROMPT + records[0]["sample"]
    assert len(records[0]["sample"]) == NEW_TOKENS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path(), args=["--no-sandbox"])
        try:
            refused = browser.new_page()  # no key given: the page says what the server answered
            refused.on("dialog", lambda dialog: dialog.dismiss())
            refused.goto(url + "/")
            expect(refused.locator("#model-info")).to_have_text(
                "error: Missing API key: send it as the header Authorization: Bearer <key>."
            )
            refused.close()

            page = browser.new_page(viewport={"width": 1100, "height": 900})
            asked: list[str] = []  # the page asks for the key once, then sends it with every request
            page.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept(KEY)))
            page.goto(url + "/")
            expect(page.locator("#model-info")).to_contain_text("2 layers x 2 heads")
            assert asked == ["This server needs its API key:"]
            page.fill("#prompt", PROMPT)
            page.fill("#temperature", "0")
            page.fill("#max_tokens", str(NEW_TOKENS))
            page.click("#generate")
            expect(page.locator("#output")).to_have_attribute("data-state", "done", timeout=20_000)
            assert page.eval_on_selector("#output", "e => e.textContent") == expected
            expect(page.locator("#status")).to_contain_text(f"{NEW_TOKENS} tokens in")

            generated = page.locator("#output .tok.gen")
            assert generated.count() == NEW_TOKENS  # one span per character token
            probs = [float(p) for p in generated.evaluate_all("els => els.map(e => e.dataset.prob)")]
            assert all(0 < p <= 1 for p in probs) and len(set(probs)) > 5
            colors = set(generated.evaluate_all("els => els.map(e => e.style.background)"))
            assert len(colors) > 5  # shaded by probability, not one colour

            generated.nth(5).hover()
            tooltip = page.locator("#tooltip")
            expect(tooltip).to_be_visible()
            rows = tooltip.locator("table.alternatives tr")
            expect(rows).to_have_count(5)
            expect(rows.first).to_have_class("chosen")  # greedy: the chosen token is the most likely
            alternatives = [float(x) for x in rows.locator("td:nth-child(2)").all_inner_texts()]
            assert alternatives == sorted(alternatives, reverse=True) and sum(alternatives) <= 1.001

            generated.nth(NEW_TOKENS - 1).click()
            attention = page.locator("#attention")
            expect(attention).to_be_visible()
            panels = page.locator("#att-grid .head-panel")
            expect(panels).to_have_count(2)  # "all heads": one panel per head of the layer
            length = len(PROMPT) + NEW_TOKENS
            cells = panels.first.locator(".strip span")
            expect(cells).to_have_count(32)  # the model's context: block_size tokens ending at the click
            weights = [
                float(t.rsplit(": ", 1)[1]) for t in cells.evaluate_all("els => els.map(e => e.title)")
            ]
            assert sum(weights) == pytest.approx(1.0, abs=0.01)
            expect(page.locator("#att-pos")).to_have_text(str(length - 1))
            page.select_option("#att-layer", "1")
            page.select_option("#att-head", "1")
            expect(panels).to_have_count(1)
            expect(panels.first.locator(".title")).to_contain_text("layer 1 head 1")

            page.select_option("#att-head", "all")
            expect(panels).to_have_count(2)
            generated.nth(20).hover()  # the screenshot shows the alternatives too
            expect(tooltip).to_be_visible()
            shot = tmp_path / "serve.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20_000
            if os.environ.get("MINI_GPT_SCREENSHOT"):  # docs/img/serve.png is taken this way
                shutil.copy(shot, os.environ["MINI_GPT_SCREENSHOT"])

            # Stop: the stream ends on the page and the generation on the server
            page.fill("#max_tokens", "1000")
            page.click("#generate")
            expect(generated.first).to_be_visible()
            page.click("#stop")
            expect(page.locator("#output")).to_have_attribute("data-state", "stopped")
            expect(page.locator("#status")).to_contain_text("stopped after")
            assert generated.count() < 1000
            deadline = time.monotonic() + 5
            while httpx.get(url + "/health").json()["waiting"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert httpx.get(url + "/health").json()["waiting"] == 0
            page.reload()  # the key is kept for the tab
            expect(page.locator("#model-info")).to_contain_text("2 layers x 2 heads")
            assert asked == ["This server needs its API key:"]
        finally:
            browser.close()

    proc.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "bound to 127.0.0.1: only this machine can connect" in err
    assert err.rstrip().endswith("mini-gpt serve: stopped")
    assert "Traceback" not in err


def test_page_shows_the_logit_lens_of_a_clicked_token_and_the_head_roles(served, tmp_path: Path) -> None:
    """Click a generated token: a lens table with one row per depth (the embedding, then after each block)
    whose last row is the model's own next-token distribution (the alternatives hover shows for the next
    token, while the text fits the context); a token past the context's length gets its table too. Then
    the heads view: three layer x head heatmaps whose values are the server's /api/heads scores."""
    url, _, _ = served
    n_layer, n_head, new_tokens = 2, 2, 40
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("dialog", lambda dialog: dialog.accept(KEY))
            page.goto(url + "/")
            expect(page.locator("#model-info")).to_contain_text(f"{n_layer} layers x {n_head} heads")
            page.fill("#prompt", PROMPT)
            page.fill("#temperature", "0")
            page.fill("#max_tokens", str(new_tokens))
            page.click("#generate")
            expect(page.locator("#output")).to_have_attribute("data-state", "done", timeout=20_000)

            generated = page.locator("#output .tok.gen")
            clicked = 15  # position 26: the text up to the next token fits the context (32), so generation
            generated.nth(clicked).click()  # read the same tokens as the lens
            lens = page.locator("#lens")
            expect(lens).to_be_visible()
            expect(page.locator("#lens-pos")).to_have_text(str(len(PROMPT) + clicked))
            rows = page.locator("#lens-table tr.depth")
            expect(rows).to_have_count(n_layer + 1)
            labels = rows.locator("th").all_inner_texts()
            assert labels == ["embedding", "block 0", "block 1 (output)"]
            for r in range(n_layer + 1):
                cells = rows.nth(r).locator("td")
                expect(cells).to_have_count(5 + 1)  # the top 5, then p(next)
                probs = [float(t.rsplit(" ", 1)[1]) for t in cells.all_inner_texts()[:5]]
                assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.001

            final = rows.nth(n_layer).locator("td")
            lens_top = [
                (t.rsplit(" ", 1)[0], float(t.rsplit(" ", 1)[1])) for t in final.all_inner_texts()[:5]
            ]
            # greedy: the token that came next is the model's top choice, outlined, with its probability
            expect(final.first).to_have_class("next")
            next_prob = float(final.last.inner_text())
            assert next_prob == lens_top[0][1]
            assert next_prob == pytest.approx(
                float(generated.nth(clicked + 1).get_attribute("data-prob")), abs=1e-3
            )
            generated.nth(clicked + 1).hover()  # its alternatives: what the model gave at that step
            alternatives = page.locator("#tooltip table.alternatives tr")
            expect(alternatives).to_have_count(5)
            hover_top = [(a, float(b)) for a, b in (r.split("\t") for r in alternatives.all_inner_texts())]
            assert [t for t, _ in hover_top] == [t for t, _ in lens_top]
            assert [q for _, q in hover_top] == pytest.approx([q for _, q in lens_top], abs=1.5e-3)

            generated.nth(30).click()  # position 41: the lens reads the 32 tokens ending there
            expect(page.locator("#lens-pos")).to_have_text(str(len(PROMPT) + 30))
            expect(rows).to_have_count(n_layer + 1)
            expect(rows.nth(n_layer).locator("td.next-prob")).to_have_text(re.compile(r"^0\.\d{3}$"))

            # The heads view: one heatmap per role, n_layer x n_head cells, each titled with its score
            expect(page.locator("#heads")).to_be_hidden()
            page.click("#heads-open")
            maps = page.locator("#heads .heatmap")
            expect(maps).to_have_count(3)
            served_roles = httpx.get(url + "/api/heads", headers={"Authorization": f"Bearer {KEY}"}).json()
            roles = maps.evaluate_all("els => els.map(e => e.dataset.role)")
            assert roles == ["previous_token", "induction", "duplicate_token"]
            for heatmap, role in zip(maps.all(), roles, strict=True):
                cells = heatmap.locator("td.score")
                expect(cells).to_have_count(n_layer * n_head)
                titles = cells.evaluate_all("els => els.map(e => e.title)")
                shown = [float(t.rsplit(" ", 1)[1]) for t in titles]
                expected = [v for row in served_roles["roles"][role] for v in row]
                assert shown == pytest.approx(expected, abs=6e-4)
                assert titles[n_head].startswith("layer 1 head 0: ")  # row-major: layer, then head
                assert heatmap.locator("tr").count() == n_layer + 1  # the head labels, then a row per layer
            generated.nth(clicked).click()
            expect(page.locator("#lens-pos")).to_have_text(str(len(PROMPT) + clicked))
            page.mouse.move(5, 5)  # no tooltip over the picture
            shot = tmp_path / "serve-inspect.png"
            page.screenshot(path=str(shot), full_page=True)
            if os.environ.get("MINI_GPT_SCREENSHOT_INSPECT"):  # docs/img/serve-inspect.png is taken this way
                shutil.copy(shot, os.environ["MINI_GPT_SCREENSHOT_INSPECT"])
            page.click("#heads-open")
            expect(page.locator("#heads")).to_be_hidden()
            page.keyboard.press("Escape")
            expect(lens).to_be_hidden()
        finally:
            browser.close()
