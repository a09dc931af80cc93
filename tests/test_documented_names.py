"""The names the README and docs/design.md give are the code's, and the code's are given.

Each class of name a reader copies into a shell, a unit file or a dashboard is checked
both ways, mechanically, as ``test_module_map.py`` checks the module map:

* ``RECONCILE_*`` variables: every one the code reads or sets (a string literal under
  ``controller/``) is named in one of the two pages, and every one they name exists;
* the README's synopsis (the code block under "The command"): every verb the parser
  has is on a line of it, and every flag a line names is one its verb takes; and every
  flag is named somewhere in the README;
* the spec fields that change in place (``IN_PLACE``): README's sentence names them all;
* the node.yaml settings the code's messages send a reader to (``git.timeout in
  node.yaml``) are settings ``NodeFile`` takes;
* the system packages ``scripts/system-packages`` installs: README's list names each;
* metrics: the README names every family the node's and the gateway's ``/metrics``
  export, and no other ``reconcile_*`` name;
* code names in docs/design.md and README: a ``.py`` path is a file, a ``module.name_x``
  whose module is one of ``controller/``'s has ``name_x`` (a ``Class.name`` its class's
  module has ``name``), and a snake_case, ``_private``
  or CamelCase name (alone or dotted) is a word of the code, unless an engine or another
  tool owns it (``ELSEWHERE``). The module tables are ``test_module_map.py``'s.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from controller.cli.main import build_parser
from controller.core.planner.records import IN_PLACE
from controller.daemon.metrics import FAMILIES as NODE_FAMILIES
from controller.gateway.accounting.metrics import FAMILIES as GATEWAY_FAMILIES
from controller.store.config.nodeconfig import NodeFile

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DESIGN = (ROOT / "docs" / "design.md").read_text()
VARIABLE = r"RECONCILE_[A-Z][A-Z_]*[A-Z]"
# Read or set by the code, deliberately in neither page: no user sets them.
UNDOCUMENTED = {
    "RECONCILE_FAILPOINTS": "the suite's fault injection (controller/failpoints.py)",
    "RECONCILE_FAILPOINTS_LOG": "where the failpoints log what they did, for the suite",
    "RECONCILE_GATEWAY_READY_FD": "a pipe's fd a starting gateway answers on (keeper.py)",
}


def _python(*folders: str) -> str:
    return "\n".join(p.read_text() for f in folders for p in sorted((ROOT / f).rglob("*.py")))


def test_every_variable_is_named_in_the_docs_and_every_one_named_exists() -> None:
    """Neither page named `RECONCILE_API_KEYS`, the variable `--api-keys` reads."""
    read = set(re.findall(rf"[\"']({VARIABLE})[\"']", _python("controller")))
    named = set(re.findall(VARIABLE, README + DESIGN))
    assert read - named - set(UNDOCUMENTED) == set(), "read by the code, named in no page"
    code = _python("controller", "tests")
    gone = {v for v in named if not re.search(rf"\b{v}\b", code)}
    assert gone == set(), "named in README or docs/design.md, read nowhere"
    assert set(UNDOCUMENTED) <= read, "an exception for a variable no longer read"


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def test_the_synopsis_names_every_verb_and_only_flags_its_verb_takes() -> None:
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    block = README[README.index("## The command") :].split("```")[1]
    on_a_line: set[str] = set()
    wrong = []
    for line in block.strip().splitlines():
        for part in line.split(" / "):  # `drain ... / reconcile uncordon`
            found = re.match(r"\s*reconcile\s+([a-z]+)\b", part)
            verb = found.group(1) if found else None
            on_a_line |= {verb} if verb else set()
            named = verbs.choices[verb] if verb else parser
            # the flags of the usage, not of the note after it (`1 when --once would fail`)
            usage = re.split(r"\s{3,}", part[found.end() if found else 0 :].strip())[0]
            flags = re.findall(r"(?<![\w-])--?[a-z][\w-]*", usage)
            wrong += [(verb, f) for f in flags if f not in _flags(named)]
    aliases = {"get"}  # `status`'s line says "(alias: get)"
    assert set(verbs.choices) - aliases - on_a_line == set(), "a verb the synopsis leaves out"
    assert wrong == [], "a flag its verb does not take"


def test_the_readme_names_every_flag() -> None:
    """By its long or its short form: it named no `--lock-timeout`."""
    unnamed = []
    for action in _all_actions(build_parser()):
        said = [o for o in action.option_strings if re.search(rf"(?<![\w-]){o}(?![\w-])", README)]
        unnamed += [] if said or not action.option_strings else [action.option_strings[-1]]
    assert unnamed == [], f"flags README never names: {sorted(set(unnamed))}"


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += [a for sub in action.choices.values() for a in _all_actions(sub)]
        elif action.help != argparse.SUPPRESS:
            found.append(action)
    return found


def test_the_readme_names_the_fields_that_change_in_place() -> None:
    """It left out `priority`, which changes in place (`plan`: `~ in-place`)."""
    end = README.index("change in\nplace (the engine keeps running)")
    said = README[:end].rsplit("\n\n", 1)[1]  # the sentence, from its paragraph's start
    assert re.findall(r"`(\w+)`", said) == list(IN_PLACE)


def _settings(schema: dict[str, Any], defs: dict[str, Any], at: str = "") -> set[str]:
    """Every setting's dotted path (``git.verify.allowedSigners``) in a JSON Schema."""
    found = set()
    for key, field in schema.get("properties", {}).items():
        found.add(at + key)
        for part in [field, *field.get("anyOf", []), field.get("items", {})]:
            ref = part.get("$ref", "").removeprefix("#/$defs/")
            if ref:
                found |= _settings(defs[ref], defs, f"{at}{key}.")
    return found


def test_a_node_yaml_setting_a_message_names_is_one_node_yaml_takes() -> None:
    """The gateway's word on an engine whose /metrics wants its key sent the reader to
    `gateway.apiKeys in node.yaml`, a setting node.yaml refuses as unknown."""
    schema = NodeFile.model_json_schema(by_alias=True)
    settings = _settings(schema, schema.get("$defs", {}))
    named = set(re.findall(r"([a-z]\w*(?:\.\w+)+) in node\.yaml", _python("controller")))
    assert named and named - settings == set(), "no such node.yaml setting"


def test_the_readme_names_every_system_package_the_tests_use() -> None:
    """It left out faketime and libcap2-bin (setcap)."""
    script = (ROOT / "scripts" / "system-packages").read_text()
    needed = set(re.findall(r"^\s*\[[^\]]+\]=([\w.+-]+)", script, re.MULTILINE))
    start = README.index("(`scripts/system-packages`: ")
    listed = set(re.findall(r"[\w.+-]+", README[start : README.index(";", start)]))
    assert needed and needed - listed == set(), "installed by the script, not in README's list"


def test_the_readme_names_every_metric_and_no_other() -> None:
    exported = set(NODE_FAMILIES) | set(GATEWAY_FAMILIES)
    named = set(re.findall(r"\breconcile_[a-z_]*[a-z]\b", README))
    assert exported - named == set(), "exported, named nowhere in README"
    assert named - exported == set(), "named in README, exported by nothing"


# Names design.md gives that are other programs' (Envoy's, vLLM's), not ours; and the
# section whose every name is an engine's source.
ELSEWHERE = {"consecutive_gateway_failure", "cache_config_info", "num_gpu_blocks", "block_size"}
OTHERS_SOURCES = "## Engine flags checked"
PAST = {"ProbeConfig.bearer"}  # what a record held before, as design.md tells the change
FILE_SUFFIXES = {"py", "json", "jsonl", "yaml", "md", "toml", "lock", "log", "prom", "sock"}


def _code_names(word: str) -> list[str]:
    """The parts of a token that name code: every part of a dotted name, else a
    snake_case, ``_private`` or CamelCase word (a plain word is prose)."""
    parts = word.split(".")
    parts = parts[:-1] if parts[-1] in FILE_SUFFIXES else parts  # `demo.yaml`, `yaml`
    if len(parts) != 1:
        return parts
    coded = "_" in parts[0].strip("_") or parts[0].startswith("_")
    return parts if coded or re.fullmatch(r"[A-Z][a-z]+[A-Z]\w*", parts[0]) else []


def _unknown(token: str, words: set[str], modules: dict[str, str], files: set[str]) -> list[str]:
    """What of ``token`` the code lacks (nothing: it names no code, or code that exists)."""
    if token.startswith("."):  # a suffix: `.partial`, `.reason`
        return []
    if token.endswith(".py"):
        return [] if any(f.endswith(token) for f in files) else [token]
    tail = token.removesuffix("()").split("/")[-1]
    dotted = re.fullmatch(r"(\w+)\.(\w+)", tail)
    if "/" in token and dotted is None:
        return []  # a state dir's path: `instances/.reserve`
    # `module.name_x` and `Class.name` (a module's `.word` may be a manifest field instead:
    # `readiness.httpGet`, `devices.count`)
    owner, name = dotted.groups() if dotted else ("", "")
    if owner in modules and (owner[0].isupper() or "_" in name) and tail not in PAST:
        return [] if re.search(rf"\b{name}\b", modules[owner]) else [tail]
    return [n for n in _code_names(tail) if n not in ELSEWHERE and n not in words]


def test_the_code_names_the_pages_give_are_the_codes() -> None:
    """It named `manifests.load_mapping` (yamlread's), `core/measured.py` (folded into
    the planner's ledger), `DeploymentSpec._with_fallbacks`, `Front._loopback_host_only`
    and aiohttp's `handler_cancellation`, all gone."""
    sources = {p: p.read_text() for p in (ROOT / "controller").rglob("*.py")}
    others = [p for d in ("tests", "benchmarks", "scripts") for p in (ROOT / d).rglob("*.py")]
    others.remove(Path(__file__).resolve())  # its docstring names what is gone
    texts = [*sources.values(), *(p.read_text() for p in others)]
    words = {w for text in texts for w in re.findall(r"\w+", text)}
    modules: dict[str, str] = {}
    for path, text in sources.items():
        for owner in [path.stem, *re.findall(r"^class (\w+)", text, re.MULTILINE)]:
            modules[owner] = modules.get(owner, "") + text  # a class: its module's text
    files = {str(p.relative_to(ROOT)) for p in [*sources, *others]}
    wrong = []
    for page, text in (("docs/design.md", DESIGN), ("README.md", README)):
        section = ""
        for number, line in enumerate(text.splitlines(), 1):
            section = line if line.startswith("## ") else section
            if section == OTHERS_SOURCES:
                continue
            for token in re.findall(r"`((?:[\w-]+/)*[\w.]+(?:\(\))?)`", line):
                wrong += [(page, number, n) for n in _unknown(token, words, modules, files)]
    assert wrong == [], f"(page, line, name): names the code lacks: {wrong}"
