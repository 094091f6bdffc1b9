"""Drives the web chat page of a running `fastllm serve` in headless Chromium over the
DevTools protocol: checks the page's Markdown renderer, sets a system prompt, types a question
into the input, sends it with Enter, waits for the streamed answer, and saves a screenshot.

Usage: browser_chat.py BASE_URL CHROMIUM SCREENSHOT.png. Exits non-zero on a failed check."""

import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket


class Page:
    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=60)
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expr: str):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr: str, seconds: float) -> None:
        end = time.time() + seconds
        while time.time() < end:
            if self.eval(expr):
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {expr}")


def start_browser(chromium: str, profile: str) -> subprocess.Popen:
    return subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1200,800",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def devtools_page(profile: str) -> str:
    port_file = os.path.join(profile, "DevToolsActivePort")
    end = time.time() + 60
    while not os.path.exists(port_file) or not open(port_file).read().strip():
        if time.time() > end:
            raise AssertionError("chromium did not open its DevTools port")
        time.sleep(0.1)
    port = open(port_file).read().split()[0]
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


MARKDOWN = [
    ("# Title\n\nSome **bold** and *it* and `x<y`.",
     "<h1>Title</h1><p>Some <strong>bold</strong> and <em>it</em> and <code>x&lt;y</code>.</p>"),
    ("- a\n- b\n\n1. one\n2. two",
     "<ul><li>a</li><li>b</li></ul><ol><li>one</li><li>two</li></ol>"),
    ("```python\nprint('<b>')\n```",
     "<pre><code class=\"lang-python\">print('&lt;b&gt;')\n</code></pre>"),
    ("<script>alert(1)</script>", "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"),
    ("[site](https://example.org) [bad](javascript:x)",
     "<p><a href=\"https://example.org\" target=\"_blank\" rel=\"noopener\">site</a> [bad](javascript:x)</p>"),
    ("```\nunfinished", "<pre><code>unfinished\n</code></pre>"),
]


def main(base: str, chromium: str, shot: str) -> None:
    # chromium's helper processes may still be writing the profile when the browser has
    # exited; a profile left behind in the temporary directory is not a failure of the page
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        browser = start_browser(chromium, profile)
        try:
            page = Page(devtools_page(profile))
            page.call("Page.enable")
            page.call("Page.navigate", url=base + "/")
            page.wait("document.readyState === 'complete' && document.body.dataset.state === 'idle'", 30)
            page.wait("document.getElementById('model').textContent.includes('tiny')", 30)
            for src, want in MARKDOWN:
                got = page.eval(f"renderMarkdown({json.dumps(src)})")
                assert got == want, (src, got, want)
            page.eval("document.getElementById('system').value = 'Answer briefly.'")
            page.eval("document.getElementById('max_tokens').value = '24'")
            page.eval("document.getElementById('input').focus()")
            page.call("Input.insertText", text="What is a cat?")
            for kind in ("keyDown", "keyUp"):
                page.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                          windowsVirtualKeyCode=13)
            page.wait("document.querySelectorAll('.msg.assistant').length === 1", 10)
            page.wait("document.querySelector('.msg.assistant').dataset.done === '1'", 120)
            user = page.eval("document.querySelector('.msg.user .body').textContent")
            answer = page.eval("document.querySelector('.msg.assistant .body').textContent")
            status = page.eval("document.getElementById('status').textContent")
            assert user == "What is a cat?", user
            assert answer.strip() and "chunks in" in status, (answer, status)
            assert page.eval("document.querySelector('.msg.assistant .err') === null")
            png = page.call("Page.captureScreenshot", format="png")["data"]
            os.makedirs(os.path.dirname(shot) or ".", exist_ok=True)
            with open(shot, "wb") as f:
                f.write(base64.b64decode(png))
        finally:
            browser.terminate()
            browser.wait(10)
    print(f"browser chat: all checks passed (screenshot {shot})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
