"""What a manifest's author, an engine or a client controls, shown on the page as text
and never run: markup and script in a model name, an alias, an engine's log and its
exit, a request log line and a drain's reason, in a real headless Chromium (the page
sets such text only as ``textContent``; its CSP would block an inline handler too)."""

from __future__ import annotations

from typing import Any

from uipage import Page

from controller.store.config import accesstoken

MODEL = '"><img src=x onerror="window.pwned=1">'
ALIAS = "javascript:window.pwned=2"
SAID = "<script>window.pwned=3</script><img src=x onerror=window.pwned=4>"
REASON = "<svg onload=window.pwned=5>' onmouseover='window.pwned=6"
# An element or attribute the page itself never makes: any is injected markup.
INJECTED = (
    'return document.querySelectorAll(\'img, svg [onload], script:not([src="/ui/app.js"]),'
    " iframe, a, [onerror], [onmouseover], [onload]').length;"
)


def test_markup_from_manifests_engines_and_clients_shows_as_text(
    reconcile: Any, gateway: Any, page: Page
) -> None:
    reconcile.write("web", model=MODEL, aliases=[ALIAS])
    said = SAID.replace("'", "'\\''")
    reconcile.write(
        "bad", command=["/bin/sh", "-c", f"echo '{said}'; exit 3"], basePort=reconcile.port + 1
    )
    g = gateway()
    g.wait_phase("web", "Ready")
    for model in (MODEL, ALIAS):  # each in the request log, as the client named it
        assert g.post(model).status == 200
    token = accesstoken.read(reconcile.state)
    drained = g.request(
        "POST",
        f"/ui/api/drain?token={token}",
        {"reason": REASON},
        {"Content-Type": "application/json"},
    )
    assert drained.status == 200, drained
    page.open(reconcile("ui", check=0).out.strip())
    page.wait(
        lambda: page.rows().get("bad", {}).get("restarts") not in (None, "0"), "bad's restart"
    )
    page.click("#deployments tr[data-name=bad]")  # its log: the engine's own line
    page.wait(lambda: SAID in page.text("log"), "bad's log line")
    shown = page.run("return document.body.innerText;")
    for text in (MODEL, ALIAS, REASON):
        assert text in shown, (text, shown)
    requests = "return document.querySelector('#requests tbody').textContent;"
    page.wait(  # the request log is written beside the answer, not before it
        lambda: MODEL in (seen := page.run(requests)) and ALIAS in seen, "the request log"
    )
    assert page.run(INJECTED) == 0, page.driver.page_source
    assert page.run("return window.pwned === undefined;")
    assert page.console_errors() == []  # a CSP refusal of an inline handler logs one
    reconcile("uncordon", check=0)
    g.finish()
