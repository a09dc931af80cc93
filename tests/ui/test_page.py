"""The node's page (GET /ui) in a real headless Chromium, against the real daemon, its
gateway process and real engines: what it shows, that it follows the state dir live,
who may see it, and that its buttons act."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from git.conftest import Remote
from modelservers import serving
from procs import kill_marked
from uipage import Page

from controller.pull import launch
from controller.store.config import accesstoken
from controller.store.models.modelcache import CacheEntry

KEY = "sk-Ui7WvKpLmRtYuXnJhGd3"
LABEL = hashlib.sha256(KEY.encode()).hexdigest()[:8]  # what events and logs call the key
MB = 1 << 20
MEMORY = {"count": 1, "kind": "nvidia", "memory": "20Gi"}


def _url(reconcile: Any) -> str:
    """The page's URL as `reconcile ui` prints it."""
    out = reconcile("ui", check=0).out
    return str(out.strip())


def _keyfile(reconcile: Any) -> Path:
    path = reconcile.tmp / "keys.txt"
    path.write_text(KEY + "\n")
    os.chmod(path, 0o600)
    return path


def _sign_in(page: Page) -> None:
    page.wait(lambda: page.shown("signin"), "the sign-in form")
    page.run("document.getElementById('key').value = arguments[0];", KEY)
    page.click("#signin button[type=submit]")


def test_the_page_shows_the_node_live_without_console_errors(
    reconcile: Any, gateway: Any, page: Page
) -> None:
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"
    reconcile.write("web", devices=MEMORY)
    g = gateway()
    g.wait_phase("web", "Ready")
    url = _url(reconcile)
    token = accesstoken.read(reconcile.state)
    assert url == f"http://127.0.0.1:{g.port}/ui?token={token}"
    page.open(url)
    page.run("window.notReloaded = true;")  # gone if the page ever reloads
    row = page.wait(lambda: page.rows().get("web"), "web's row")
    # The token is kept for the tab's calls and gone from the address bar (and history).
    assert page.driver.current_url == f"http://127.0.0.1:{g.port}/ui"
    assert page.run("return sessionStorage.getItem('reconcile.apiKey');") == token
    assert row["phase"] == "Ready" and row["ready"] == "1/1", row
    assert row["port"] == str(reconcile.status("web")["web"]["port"]), row
    # A manifest added to the folder: the daemon's pass, then the page's next poll.
    written = time.monotonic()
    reconcile.write("chat")
    page.wait(lambda: page.rows().get("chat"), "the new manifest's row")
    seen = time.monotonic() - written
    page.wait(lambda: page.rows()["chat"]["phase"] == "Ready", "chat Ready")
    assert page.run("return window.notReloaded === true;"), "the page reloaded"
    # Traffic: requests through the gateway show in web's sparklines.
    for _ in range(10):  # spread over a few samples: the sparklines draw a line
        assert g.post("web").status == 200
        time.sleep(0.3)
    traffic = page.wait(lambda: page.traffic().get("web"), "web's traffic")
    assert set(traffic) == {"requests", "errors", "p50", "p99"}, traffic
    page.wait(lambda: page.traffic()["web"]["p50"].endswith(" ms"), "web's p50")
    # The request log's last requests (gateway/accounting/requestlog.py), newest first.
    cells = (
        "return [...document.querySelectorAll('#requests tbody tr')]"
        ".map((r) => [...r.cells].map((c) => c.textContent));"
    )
    rows = page.wait(lambda: page.run(cells), "the last requests")
    assert rows[0][1:3] == ["200", "web"] and rows[0][3].startswith("web"), rows
    assert re.fullmatch(r"\d+\+\d+", rows[0][7]), rows  # the engine's usage: prompt+answer
    # A request no engine answered has no usage: "-", as `logs --requests` says (it read
    # "0+0", an answer of no tokens, on a gateway trial's page).
    assert g.post("nowhere").status == 404
    rows = page.wait(lambda: (r := page.run(cells)) and r[0][2] == "nowhere" and r, "the 404")
    assert rows[0][1] == "404" and rows[0][7] == "-", rows
    # A click on a row shows that deployment's log and its events only.
    page.click("#deployments tr[data-name=web] td.name")
    log = page.wait(lambda: "demo engine web" in page.text("log") and page.text("log"), "the log")
    assert "demo engine chat" not in log
    page.wait(lambda: {e["deployment"] for e in page.events()} == {"web"}, "web's events only")
    assert page.console_errors() == []
    shot = page.screenshot("ui.png")
    if os.environ.get("RECONCILE_UI_SCREENSHOT"):  # how docs/ui.png is made
        Path(os.environ["RECONCILE_UI_SCREENSHOT"]).write_bytes(shot.read_bytes())
    print(f"manifest written -> row on the page: {seen:.2f}s; screenshot {shot}")
    g.finish()


def test_a_killed_engine_shows_its_restart(reconcile: Any, gateway: Any, page: Page) -> None:
    reconcile.write("web")
    g = gateway()
    pid = g.wait_phase("web", "Ready")["pid"]
    page.open(_url(reconcile))
    page.wait(lambda: page.rows().get("web", {}).get("phase") == "Ready", "web Ready")
    os.kill(pid, signal.SIGKILL)
    row = page.wait(
        lambda: (r := page.rows()["web"])["restarts"] == "1" and r["phase"] == "Ready" and r,
        "web restarted once and Ready again",
    )
    assert reconcile.status("web")["web"]["pid"] != pid, row
    assert row["last_exit"] == "last exit: killed by signal 9", row
    events = page.events()
    assert any(e["deployment"] == "web" and e["action"] == "restart" for e in events), events
    assert page.console_errors() == []
    g.finish()


def test_the_device_bars_match_devices_json(reconcile: Any, gateway: Any, page: Page) -> None:
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=40Gi"
    reconcile.write("small", devices=MEMORY)
    reconcile.write("whole", devices={"count": 1, "kind": "nvidia"})
    g = gateway()
    g.wait_phase("small", "Ready")
    g.wait_phase("whole", "Ready")
    page.open(_url(reconcile))
    bars = page.wait(lambda: (d := page.devices()) and all(x["holders"] for x in d) and d, "bars")
    listed = reconcile("devices", "-o", "json", check=0).json()["devices"]
    assert [b["device"] for b in bars] == [d["device"] for d in listed]
    for bar, item in zip(bars, listed, strict=True):
        assert bar["total"] == item["memory"], (bar, item)
        assert bar["requested"] == item["memory_allocated"], (bar, item)
        assert bar["holders"] == item["held_by"], (bar, item)
        assert bar["health"] == item["health"], (bar, item)
        whole = any(h["memory"] is None for h in item["holders"])
        assert bar["free"] == (0 if whole else item["memory"] - item["memory_allocated"]), bar
    g.finish()


def test_without_the_token_the_page_shows_nothing_and_says_how(
    reconcile: Any, gateway: Any, page: Page
) -> None:
    reconcile.write("web")
    g = gateway()
    g.wait_phase("web", "Ready")
    page.open(f"http://127.0.0.1:{g.port}/ui")  # as another local user would: no token
    page.wait(lambda: page.shown("signin"), "the sign-in form")
    assert page.shown("signin-token") and not page.shown("signin-keys")
    assert "reconcile ui" in page.text("signin-token")
    assert not page.shown("data") and page.rows() == {} and page.devices() == []
    assert "web" not in page.run("return document.body.innerText;")
    # A wrong token is said to be wrong; the right one, given in the form, opens it.
    page.run("document.getElementById('key').value = 'not-the-token';")
    page.click("#signin button[type=submit]")
    page.wait(lambda: page.shown("signin-error"), "the refusal")
    assert "token was not accepted" in page.text("signin-error")
    page.run(
        "document.getElementById('key').value = arguments[0];", accesstoken.read(reconcile.state)
    )
    page.click("#signin button[type=submit]")
    page.wait(lambda: page.rows().get("web"), "web's row with the token")
    g.finish()


def test_with_keys_the_page_shows_a_sign_in_and_no_data(
    reconcile: Any, gateway: Any, page: Page
) -> None:
    reconcile.write("web")
    assert "no gateway runs" in reconcile("ui", check=1).err
    g = gateway("--api-keys", str(_keyfile(reconcile)))
    g.wait_phase("web", "Ready")
    # --open: a browser from $BROWSER (Python's webbrowser), here a script noting the URL.
    opened = reconcile.tmp / "opened.txt"
    browser = reconcile.tmp / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    told = reconcile("ui", "--open", check=0, env={"BROWSER": f"{browser} %s"})
    assert "the page asks for one" in told.err, told
    assert opened.read_text().strip() == told.out.strip() == f"http://127.0.0.1:{g.port}/ui"
    answer = g.request("GET", "/ui/api/state")
    assert answer.status == 401, answer
    assert answer.json()["error"]["code"] == "invalid_api_key"
    assert b"web" not in answer.body
    assert g.request("GET", "/ui/api/logs/web").status == 401
    json_body = {"Content-Type": "application/json"}
    restart = g.request("POST", "/ui/api/restart", {"name": "web"}, json_body)
    assert restart.status == 401, restart
    page.open(_url(reconcile))
    page.wait(lambda: page.shown("signin"), "the sign-in form")
    assert page.shown("signin-keys") and not page.shown("signin-token")
    assert not page.shown("data")
    assert page.rows() == {} and page.devices() == [] and page.events() == []
    assert "web" not in page.run("return document.body.innerText;")
    authorized = {"Authorization": f"Bearer {KEY}"}
    assert g.request("GET", "/ui/api/state", headers=authorized).status == 200
    _sign_in(page)
    page.wait(lambda: page.rows().get("web"), "web's row once signed in")
    assert not page.shown("signin")
    assert page.run("return sessionStorage.getItem('reconcile.apiKey');") == KEY
    # Signed out, nothing of the node stays: its drain banner (and reason) kept showing.
    reconcile("drain", "--reason", "swap the fans", check=0)
    page.wait(lambda: "swap the fans" in page.text("banner"), "the drain banner")
    page.click("#signout")
    page.wait(lambda: page.shown("signin"), "the sign-in form again")
    assert not page.shown("banner") and not page.shown("source")
    shown = page.run("return document.body.innerText;")
    assert "swap the fans" not in shown and "web" not in shown, shown  # the filter's too
    assert "Deployments" not in shown, shown  # the data section's empty tables, visible
    reconcile("uncordon", check=0)
    g.finish()


def test_the_unload_button_stops_an_on_demand_engine(
    reconcile: Any, gateway: Any, page: Page
) -> None:
    reconcile.write("lazy", activation="OnDemand", idleTimeout="10m")
    g = gateway("--api-keys", str(_keyfile(reconcile)))
    g.wait_phase("lazy", "Idle")
    page.open(_url(reconcile))
    _sign_in(page)
    page.wait(lambda: "load" in page.rows().get("lazy", {}).get("buttons", []), "a Load button")
    page.click("#deployments button[data-action=load][data-name=lazy]")
    g.wait_phase("lazy", "Ready")
    assert reconcile.pids("lazy")
    page.wait(lambda: page.rows()["lazy"]["phase"] == "Ready", "lazy Ready on the page")
    page.click("#deployments button[data-action=unload][data-name=lazy]")
    reconcile.wait_for(lambda: not reconcile.pids("lazy"), timeout=30, what="lazy's engine gone")
    g.wait_phase("lazy", "Idle")
    page.wait(lambda: page.rows()["lazy"]["phase"] == "Idle", "lazy Idle on the page")
    asked = [e for e in reconcile.events("lazy") if e["action"] in ("load", "unload")]
    assert [(e["action"], e["key"]) for e in asked] == [("load", LABEL), ("unload", LABEL)]
    assert LABEL in asked[-1]["reason"] and KEY not in json.dumps(asked)
    parked = [e for e in reconcile.events("lazy") if e["action"] == "park"]
    assert parked[-1]["reason"].startswith("unloaded"), parked
    # A request after the unload starts it again, as any request to an Idle one does.
    assert g.post("lazy", {"Authorization": f"Bearer {KEY}"}).status == 200
    g.finish()


def test_restart_drain_and_uncordon_buttons(reconcile: Any, gateway: Any, page: Page) -> None:
    reconcile.write("web")
    g = gateway()
    pid = g.wait_phase("web", "Ready")["pid"]
    page.open(_url(reconcile))
    page.wait(lambda: page.rows().get("web", {}).get("phase") == "Ready", "web Ready")
    page.click("#deployments button[data-action=restart][data-name=web]")
    reconcile.wait_for(
        lambda: (
            # The record may be gone for a moment while its instance is replaced.
            (s := reconcile.status("web").get("web", {})).get("pid") not in (None, pid)
            and s["phase"] == "Ready"
        ),
        timeout=30,
        what="a new Ready instance of web",
    )
    asked = [e for e in reconcile.events("web") if e["action"] == "restart" and "key" in e]
    assert [e["key"] for e in asked] == ["-"], asked  # the page's: no keys, no label
    # Drain asks why in a prompt; the banner then says who drained it.
    page.driver.find_element("id", "drain").click()
    prompt = page.driver.switch_to.alert
    prompt.send_keys("swap the fans")
    prompt.accept()
    banner = page.wait(lambda: page.shown("banner") and page.text("banner"), "the drain banner")
    assert "swap the fans" in banner and "the web page" in banner, banner
    drained = reconcile("status", check=0)
    assert "is drained by the web page (no API keys) (swap the fans)" in drained.err, drained
    page.click("#uncordon")
    page.wait(lambda: not page.shown("banner"), "the banner gone")
    assert (reconcile.state / "drain.json").exists() is False
    assert [e["action"] for e in reconcile.events("web")][-2:] == ["drain", "uncordon"]
    assert page.console_errors() == []
    g.finish()


def test_a_phone_sized_dark_page_fits_its_width(reconcile: Any, gateway: Any, page: Page) -> None:
    reconcile.write("web", devices=MEMORY)
    reconcile.devices = "nvidia:0=80Gi"
    g = gateway()
    g.wait_phase("web", "Ready")
    page.driver.set_window_size(390, 844)
    dark = [{"name": "prefers-color-scheme", "value": "dark"}]
    page.driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": dark})
    page.open(_url(reconcile))
    page.wait(lambda: page.rows().get("web"), "web's row")
    # Wide tables scroll inside their card; the page itself never scrolls sideways.
    width = page.run("return [document.documentElement.scrollWidth, window.innerWidth];")
    assert width[0] <= width[1], width
    background = page.run("return getComputedStyle(document.body).backgroundColor;")
    assert background == "rgb(17, 20, 24)", background  # the dark theme's --bg
    page.screenshot("ui-phone-dark.png")
    g.finish()


def test_a_pull_shows_its_progress_bar(reconcile: Any, gateway: Any, page: Page) -> None:
    data = os.urandom(2 * MB + 777)
    source = {"url": "", "sha256": hashlib.sha256(data).hexdigest()}
    argv = reconcile.demo_command()
    try:
        with serving({"tiny.gguf": data}, hold=MB) as server:  # stops sending at 1 MB
            source["url"] = server.url("tiny.gguf")
            reconcile.write("pulled", command=[*argv[:-1], "{model}"], source=source)
            # The fixture's resync is 1 h: the daemon looks each second while a pull runs.
            g = gateway()
            page.open(_url(reconcile))
            bar = page.wait(
                lambda: (b := page.pull_bar("pulled")) and b["done"] >= MB and b, "the pull bar"
            )
            assert bar["total"] == len(data), bar
            assert page.rows()["pulled"]["phase"] == "Pulling"
            server.release()
            entry = CacheEntry.of(reconcile.state / "models", f"sha256-{source['sha256']}")
            reconcile.wait_for(lambda: entry.model_path(), timeout=30, what="the file pulled")
            g.wait_phase("pulled", "Ready")
            page.wait(lambda: page.pull_bar("pulled") is None, "the bar gone once pulled")
            assert page.console_errors() == []
            g.finish()
    finally:
        left = kill_marked(str(reconcile.state / "models"), marker=launch.MARKER)
        assert not left, f"pull processes left running: {left}"


def test_the_page_shows_the_git_source_and_its_state(
    reconcile: Any, gateway: Any, page: Page
) -> None:
    """The line `status` prints above its table: Synced at the commit, then Degraded
    naming the file of a pushed typo (the engine runs on), then Synced again."""
    remote = Remote(reconcile.tmp / "git", reconcile)
    first = remote.deploy("web")
    g = gateway("--git", remote.url, "--git-path", "manifests", "--interval", "1s")
    g.wait_phase("web", "Ready")
    page.open(_url(reconcile))

    def line(state: str) -> str | None:
        text = page.text("source") if page.shown("source") else ""
        return text if f": {state} at " in text else None

    said = page.wait(lambda: line("Synced"), "the source line, Synced")
    assert said.startswith(f"source: {remote.url} main path manifests: Synced at {first[:12]}")
    looks = "return document.getElementById('source').className;"
    assert page.run(looks) == "source ok"
    typo = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: web\n"
    broken = remote.commit({"manifests/web.yaml": typo}, "a typo")
    said = page.wait(lambda: line("Degraded"), "the source line, Degraded")
    assert f"Degraded at {broken[:12]}" in said and "manifests/web.yaml:" in said, said
    assert page.run(looks) == "source bad"
    assert page.rows()["web"]["phase"] == "Ready"  # what it declared before runs on
    fixed = remote.deploy("web", message="fixed")
    said = page.wait(lambda: line("Synced"), "Synced again")
    assert f"Synced at {fixed[:12]}" in said, said
    assert page.console_errors() == []
    g.finish()
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def _torn_bars(page: Page) -> list[dict[str, Any]] | None:
    """The device bars once the page drew the unreadable records' (both held)."""
    bars = page.devices()
    return bars if sum(bool(b["holders"]) for b in bars) == 2 else None


def test_an_unreadable_record_is_named_on_the_page(
    reconcile: Any, gateway: Any, page: Page
) -> None:
    """The page once showed nothing of a record it could not read (its API kept the last
    good reading): it names each (file, what is wrong, the next move) as `status` does,
    and what a record of an unknown version holds is held on its device bar. A torn
    record's last good row once stayed under the red box: it goes, as in `status`, and
    its device shows held by the torn record."""
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"
    reconcile.write("web", devices={"count": 1, "kind": "nvidia"})
    g = gateway()
    g.wait_phase("web", "Ready")
    (device,) = reconcile.record("web")["devices"]
    assert g.stop() == 0  # the gateway serves on; no pass moves the torn record aside
    page.open(_url(reconcile))
    page.wait(lambda: "web" in page.rows(), "web's row, read before its record is torn")
    reconcile.record_path("web").write_text("{")
    future = {"version": 7, "name": "old", "devices": ["nvidia:1"], "port": reconcile.port + 9}
    reconcile.record_path("old").write_text(json.dumps(future))
    token = accesstoken.read(reconcile.state)
    answer = g.request("GET", f"/ui/api/state?token={token}")
    assert answer.status == 200, answer
    named = {u["name"]: u for u in answer.json()["unreadable"]}
    said = reconcile("status", check=1).err  # what the page says is what status says
    assert set(named) == {"old", "web"}, named
    for item in named.values():
        assert item["file"] == str(reconcile.record_path(item["name"])), item
        assert f"error: {item['message']}" in said, (item, said)
    assert "not valid JSON" in named["web"]["message"] and "next pass" in named["web"]["message"]
    assert "has version 7" in named["old"]["message"]
    shown = page.wait(lambda: page.shown("unreadable") and page.text("unreadable"), "the named")
    assert all(item["message"] in shown for item in named.values()), shown
    bars = {b["device"]: b for b in page.wait(lambda: _torn_bars(page), "the device bars")}
    assert bars["nvidia:1"]["holders"] == ["old (unreadable record)"], bars
    assert bars[device]["holders"] == ["web (torn record)"], bars
    assert "web" not in page.rows(), page.rows()  # no last good row: `status` shows none
    assert [d["name"] for d in answer.json()["deployments"]] == [], answer.json()
    assert page.console_errors() == []
    reconcile.record_path("old").unlink()
    g.finish()  # `down` adopts web's engine by its marker, then stops it
