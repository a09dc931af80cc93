"""The YAML reader: folders -> specs, and for bad input an error naming file, line and field.

Invariant 11: malformed YAML, wrong types, unknown fields, duplicate names and
unreadable files each give a clear error; the other manifests still load.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.store.sources.manifests import LoadResult, load
from controller.store.sources.yamlread import MAX_FILE_BYTES

GOOD = """\
apiVersion: reconcile/v1
kind: Deployment
metadata:
  name: {name}
spec:
  engine: command
  command: [serve, "{{port}}"]
"""


def write(folder: Path, file: str, text: str) -> Path:
    path = folder / file
    path.write_text(text)
    return path


def only_error(result: LoadResult) -> str:
    assert len(result.errors) == 1, [str(e) for e in result.errors]
    return str(result.errors[0])


def test_loads_each_document_of_each_file(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD.format(name="a") + "---\n" + GOOD.format(name="b"))
    write(tmp_path, "c.yml", GOOD.format(name="c"))
    result = load([tmp_path])
    assert result.ok and result.prune_safe
    assert sorted(result.entries) == ["a", "b", "c"]
    b = result.entries["b"]
    assert b.source == str(tmp_path / "a.yaml")
    assert b.line == 9  # the line where its document starts
    assert b.hash.startswith("sha256:")


def test_skips_hidden_temp_and_other_files(tmp_path: Path) -> None:
    write(tmp_path, ".hidden.yaml", "{broken")
    write(tmp_path, "notes.txt", "{broken")
    write(tmp_path, "a.yaml~", "{broken")
    write(tmp_path, "a.yaml.swp", "{broken")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "deep.yaml", "{broken")
    write(tmp_path, "a.yaml", GOOD.format(name="a"))
    result = load([tmp_path])
    assert result.ok and list(result.entries) == ["a"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: a\nspec: {}\n",
            "bad.yaml:4: invalid YAML",
            id="malformed-yaml-names-line",
        ),
        pytest.param(
            GOOD.format(name="a") + "  devices:\n    count: many\n",
            "bad.yaml:9: spec.devices.count: Input should be a valid integer",
            id="wrong-type-names-line-and-field",
        ),
        pytest.param(
            GOOD.format(name="a") + "  devices:\n    count: 1\n    gpus: 2\n",
            "bad.yaml:10: spec.devices.gpus: unknown field",
            id="unknown-field-names-its-line",
        ),
        pytest.param(
            GOOD.format(name="a") + "  port: 1\n  port: 2\n",
            "bad.yaml:9: invalid YAML: duplicate key 'port': already written on line 8 in spec, "
            "and YAML takes a key once: keep the one meant",
            id="duplicate-key",
        ),
        pytest.param(
            GOOD.format(name="a").replace('  command: [serve, "{port}"]\n', ""),
            "bad.yaml:5: spec: engine 'command' needs spec.command",
            id="missing-command-points-at-spec",
        ),
        pytest.param(
            "- just\n- a list\n",
            "bad.yaml:1: a document must be a mapping (apiVersion: reconcile/v1, kind: ...), not "
            "a list",
            id="not-a-mapping",
        ),
        pytest.param(
            GOOD.format(name="a").replace("\n", "\n  ").replace("apiVersion", "- apiVersion"),
            "bad.yaml:1: a document must be a mapping, not a list of them: write each manifest "
            "as its own document, separated by a line `---`",
            id="a-list-of-manifests",
        ),
        pytest.param(
            "base: &b {engine: command}\nspec:\n  <<: *b\n",
            "bad.yaml:3: invalid YAML: merge keys ('<<') are not supported in manifests: write "
            "the fields out in full where the '<<' is",
            id="merge-keys-refused",
        ),
        pytest.param(
            GOOD.format(name="a" * 70),
            "bad.yaml:4: metadata.name: name of 70 characters: a DNS-1123 label has at most 63 "
            "(lower-case letters, digits and '-'): shorten it; spec.aliases gives the gateway "
            "longer model names",
            id="a-name-too-long",
        ),
        pytest.param(
            GOOD.format(name="Bad_Name"),
            "bad.yaml:4: metadata.name: name 'Bad_Name' is not a DNS-1123 label",
            id="bad-name",
        ),
        pytest.param(
            "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
            + "".join(
                f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
                for p, c in zip("abcdef", "bcdefg", strict=True)
            ),
            "more than 20000 YAML nodes (alias expansion?)",
            id="billion-laughs-bounded",
        ),
        pytest.param(
            "---\n".join(GOOD.format(name=f"a{i}") for i in range(2500)),
            "more than 20000 YAML nodes of a file: split its documents into several files",
            id="a-file-of-thousands-of-manifests",
        ),
        pytest.param("[" * 200 + "]" * 200, "nested deeper than", id="deep-nesting-bounded"),
        pytest.param("{1: 2}\n", "mapping key 1 must be a string", id="non-string-key"),
        pytest.param(
            "name: ci\non:\n  push: {}\n",  # a CI workflow dropped in the folder
            "bad.yaml:2: invalid YAML: mapping key 'on' reads as true in YAML: quote it",
            id="yaml-1-1-boolean-key",
        ),
        pytest.param(
            "services:\n  web: {image: nginx}\n",  # a compose file: no field of ours at all
            "bad.yaml:1: apiVersion: not a reconcile manifest (no apiVersion, kind, metadata "
            "or spec: another tool's file?)",
            id="another-tool-s-file",
        ),
        pytest.param(
            GOOD.format(name="web").replace("  engine", "\tengine"),
            "bad.yaml:6: invalid YAML: found character that cannot start any token (a tab at "
            "column 1: YAML indents with spaces only)",
            id="tab-indent",
        ),
        pytest.param(
            GOOD.format(name="web") + "  \tport: 8000\n",
            "bad.yaml:8: invalid YAML: found character that cannot start any token (a tab at "
            "column 3: YAML indents with spaces only)",
            id="tab-after-spaces",
        ),
        pytest.param(
            GOOD.format(name="web").replace("{port}", "{prot}"),
            "bad.yaml:7: spec.command[1]: unknown placeholder '{prot}': did you mean {port}?",
            id="mistyped-placeholder",
        ),
    ],
)
def test_bad_input_names_file_line_and_field(tmp_path: Path, text: str, expected: str) -> None:
    write(tmp_path, "bad.yaml", text)
    write(tmp_path, "good.yaml", GOOD.format(name="good"))
    result = load([tmp_path])
    message = only_error(result)
    assert expected in message, message
    assert message.startswith(str(tmp_path / "bad.yaml"))
    assert "good" in result.entries  # nothing else is disturbed


def test_broken_file_is_a_broken_source(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", "{{{")
    result = load([tmp_path])
    assert result.broken_sources == {str(bad)}
    assert not result.invalid_names


def test_invalid_named_document_keeps_its_name(tmp_path: Path) -> None:
    write(tmp_path, "bad.yaml", GOOD.format(name="a") + "  port: nope\n")
    result = load([tmp_path])
    assert "a" in result.invalid_names and "spec.port" in result.invalid_names["a"]
    assert not result.broken_sources  # other deployments of the file are still known


def test_invalid_unnamed_document_breaks_its_file(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", GOOD.format(name="a").replace("name: a", "name: A!"))
    result = load([tmp_path])
    assert result.broken_sources == {str(bad)}


def test_duplicate_names_across_files_are_both_reported(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD.format(name="web"))
    write(tmp_path, "b.yaml", GOOD.format(name="web"))
    result = load([tmp_path])
    assert "web" not in result.entries and "web" in result.invalid_names
    messages = sorted(str(e) for e in result.errors)
    assert len(messages) == 2
    assert messages[0].startswith(f"{tmp_path / 'a.yaml'}:4: metadata.name: duplicate")
    assert f"also declared in {tmp_path / 'b.yaml'}:4" in messages[0]
    assert f"also declared in {tmp_path / 'a.yaml'}:4" in messages[1]
    # status' message for the engine left running names the file and field, as others do
    said = result.invalid_names["web"]
    also = f"also declared in {tmp_path / 'a.yaml'}:4"
    assert (
        said == f"{tmp_path / 'b.yaml'}:4: metadata.name: duplicate deployment name 'web': {also}"
    )


def test_duplicate_of_an_invalid_document(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD.format(name="web") + "  port: nope\n")
    write(tmp_path, "b.yaml", GOOD.format(name="web"))
    result = load([tmp_path])
    assert "web" not in result.entries
    said = [str(e) for e in result.errors if "metadata.name:" in str(e)]
    assert said == [
        f"{tmp_path / 'b.yaml'}:4: metadata.name: duplicate deployment name 'web': also "
        f"declared in {tmp_path / 'a.yaml'}:4"
    ]


def test_a_name_declared_three_times_names_its_line_each_time(tmp_path: Path) -> None:
    """Each duplicate points at metadata.name's line, not its document's first (a comment,
    apiVersion), and a third names the first declaration: it said 'an invalid document'."""
    write(tmp_path, "a.yaml", "# the web server\n" + GOOD.format(name="web"))
    second = GOOD.format(name="web").replace("metadata:\n", "metadata:\n  labels: {a: b}\n")
    write(tmp_path, "b.yaml", second + "---\n" + GOOD.format(name="web"))
    said = sorted(str(e) for e in load([tmp_path]).errors)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    message = "metadata.name: duplicate deployment name 'web': also declared in"
    assert said == [
        f"{a}:5: {message} {b}:5",
        f"{b}:13: {message} {a}:5",
        f"{b}:5: {message} {a}:5",
    ]


def test_duplicates_across_folders(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    write(tmp_path / "x", "a.yaml", GOOD.format(name="web"))
    write(tmp_path / "y", "a.yaml", GOOD.format(name="web"))
    result = load([tmp_path / "x", tmp_path / "y"])
    assert len(result.errors) == 2 and not result.entries


@pytest.mark.parametrize("also", ["the folder again", "its file", "the file by a link"])
def test_one_file_named_twice_is_read_once(tmp_path: Path, also: str) -> None:
    """`-f m -f m/web.yaml` (or `-f m -f m`): one file, so no duplicate names (issue 34, 16)."""
    folder = tmp_path / "m"
    folder.mkdir()
    web = write(folder, "web.yaml", GOOD.format(name="web"))
    second = {
        "the folder again": folder,
        "its file": web,
        "the file by a link": tmp_path / "l.yaml",
    }
    (tmp_path / "l.yaml").symlink_to(web)
    result = load([folder, second[also]])
    assert result.ok, [str(e) for e in result.errors]
    assert list(result.entries) == ["web"] and result.files == [str(web)]


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("directory", "a folder, not a file: name it its own -f, or rename it"),
        ("fifo", "not a regular file (mode p"),
        ("not-utf8", "not UTF-8 text (byte 0xff at column 1): save the file as UTF-8"),
        ("too-big", "bytes is over the 1048576-byte limit of a file: split its documents into"),
        ("dangling-link", "nowhere.yaml', which does not exist"),
        ("symlink-loop", "a symlink loop: point the link at a file"),
    ],
)
def test_unreadable_files(tmp_path: Path, kind: str, reason: str) -> None:
    path = tmp_path / "bad.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink-loop":
        path.symlink_to("loop.yaml")
        (tmp_path / "loop.yaml").symlink_to("bad.yaml")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "too-big":
        path.write_text("# " + "x" * MAX_FILE_BYTES)
    else:  # deep, as pytest's own folders can be: the name is what the message keeps
        path.symlink_to(tmp_path / ("deep" * 25) / "nowhere.yaml")
    write(tmp_path, "good.yaml", GOOD.format(name="good"))
    result = load([tmp_path])
    message = next(str(e) for e in result.errors if e.file == str(path))
    where = f"{path}:1" if kind == "not-utf8" else str(path)  # a byte has a line
    assert message.startswith(f"{where}: cannot read: "), message
    assert reason in message and "Errno" not in message, message
    assert str(path) in result.broken_sources
    assert "good" in result.entries


def test_symlink_within_the_folder_is_followed(tmp_path: Path) -> None:
    """A Kubernetes ConfigMap mount: x.yaml -> ..data/x.yaml -> ..2026_12_01/x.yaml."""
    folder = tmp_path / "m"
    (folder / "..2026_12_01").mkdir(parents=True)
    write(folder / "..2026_12_01", "web.yaml", GOOD.format(name="web"))
    (folder / "..data").symlink_to("..2026_12_01")
    (folder / "web.yaml").symlink_to("..data/web.yaml")
    assert list(load([folder]).entries) == ["web"]


def test_a_symlinked_folder_is_followed(tmp_path: Path) -> None:
    write(tmp_path, "web.yaml", GOOD.format(name="web"))
    (tmp_path / "link").symlink_to(tmp_path)
    assert list(load([tmp_path / "link"]).entries) == ["web"]


def test_symlink_out_of_the_folder_is_refused_unread(tmp_path: Path) -> None:
    """`ln -s /etc/shadow m/x.yaml`: refused by name, and not one byte of it is quoted."""
    (tmp_path / "m").mkdir()
    secret = tmp_path / "secret"
    secret.write_text("root:$6$s3cr3t-h4sh:20228:0:99999:7:::\nweb: {x: 1}\n")
    link = tmp_path / "m" / "x.yaml"
    link.symlink_to(secret)
    result = load([tmp_path / "m"])
    message = only_error(result)
    assert message.startswith(f"{link}: cannot read: a symlink to"), message
    assert "outside the manifests folder" in message
    assert "s3cr3t" not in message and "root:" not in message
    assert str(link) in result.broken_sources  # what it declared before is left alone


@pytest.mark.parametrize("value", ["1.5", "20.0", ".inf", "[]", "{}", "[20Gi]", "{a: 1}"])
def test_memory_of_any_wrong_type_is_an_error_not_a_crash(tmp_path: Path, value: str) -> None:
    """`devices.memory: 1.5` raised TypeError and ended every command and the daemon."""
    spec = f"  devices: {{count: 1, kind: nvidia, memory: {value}}}\n"
    write(tmp_path, "m.yaml", GOOD.format(name="m") + spec)
    write(tmp_path, "ok.yaml", GOOD.format(name="ok"))
    result = load([tmp_path])
    message = only_error(result)
    assert message.startswith(f"{tmp_path / 'm.yaml'}:8: spec.devices.memory: "), message
    assert list(result.entries) == ["ok"] and "m" in result.invalid_names


def test_an_unexpected_error_in_one_file_is_that_files_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last guard (invariant 11): a bug met while checking one manifest never ends
    the load, and so never a pass or the daemon; the other files load as usual."""
    from controller.store.sources import manifests

    real = manifests.load_file

    def planted(path: Path, *args: object, **kwargs: object) -> None:
        real(path, *args, **kwargs)  # type: ignore[arg-type]
        if path.name == "bad.yaml":
            raise TypeError("expected string or bytes-like object, got 'float'")

    monkeypatch.setattr(manifests, "load_file", planted)
    write(tmp_path, "bad.yaml", GOOD.format(name="bad"))
    write(tmp_path, "ok.yaml", GOOD.format(name="ok"))
    result = load([tmp_path])
    message = only_error(result)
    assert message.startswith(f"{tmp_path / 'bad.yaml'}: could not be checked"), message
    assert "TypeError" in message
    assert list(result.entries) == ["ok"]  # half a file is not the file
    assert str(tmp_path / "bad.yaml") in result.broken_sources


def test_a_long_unknown_key_is_quoted_short(tmp_path: Path) -> None:
    key = "k" * 500 + "\\x00"
    write(tmp_path, "m.yaml", GOOD.format(name="m") + f'  "{key}": 1\n')
    message = only_error(load([tmp_path]))
    assert "unknown field" in message and len(message) < 300, message


# -- invariant 5: what may prune ------------------------------------------------------------


def test_missing_folder_is_not_prune_safe(tmp_path: Path) -> None:
    result = load([tmp_path / "gone"])
    assert result.missing_folders == [str(tmp_path / "gone")]
    assert not result.prune_safe and result.ok


def test_one_missing_folder_of_two_is_not_prune_safe(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD.format(name="a"))
    result = load([tmp_path, tmp_path / "gone"])
    assert "a" in result.entries and not result.prune_safe


def test_empty_folder_is_not_prune_safe(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "no manifests here")
    assert not load([tmp_path]).prune_safe


@pytest.mark.parametrize("text", ["", "# all commented out\n", "---\n...\n"], ids=repr)
def test_folder_of_documentless_files_is_not_prune_safe(tmp_path: Path, text: str) -> None:
    """A truncated checkout (files with no document) holds no manifests: prune nothing."""
    write(tmp_path, "a.yaml", text)
    result = load([tmp_path])
    assert result.ok and not result.entries
    assert not result.prune_safe


def test_folder_that_is_a_file(tmp_path: Path) -> None:
    """`-f /etc/passwd` said the folder "does not exist" (issue 34, item 23): it is there."""
    path = write(tmp_path, "file", "x")
    result = load([path])
    assert not result.prune_safe
    said = "is not a folder, nor a manifest file (.yaml, .yml)"
    assert only_error(result) == f"{path}: {said}: -f takes a folder or one manifest file"
    assert result.folder_problems() == [f"manifests folder {path} {said}"]
    through = load([path / "x.d"])  # a path through a file is not there at all
    assert through.ok and through.folder_problems() == [
        f"manifests folder {path / 'x.d'} does not exist"
    ]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("  env:\n    BAD-NAME: x\n", "bad.yaml:8: spec.env: env name 'BAD-NAME'"),
        (
            "  readiness:\n    httpGet:\n      path: health\n",
            "bad.yaml:10: spec.readiness.httpGet.path",
        ),
    ],
    ids=["env-name", "probe-path"],
)
def test_validator_errors_name_the_field(tmp_path: Path, extra: str, expected: str) -> None:
    write(tmp_path, "bad.yaml", GOOD.format(name="a") + extra)
    assert expected in only_error(load([tmp_path]))


def test_trailing_and_empty_documents_are_skipped(tmp_path: Path) -> None:
    text = "---\n" + GOOD.format(name="a") + "---\n# commented out\n---\n"
    write(tmp_path, "a.yaml", text)
    result = load([tmp_path])
    assert result.ok, [str(e) for e in result.errors]
    assert list(result.entries) == ["a"] and result.prune_safe


def test_a_spec_its_recipe_refuses_is_invalid_at_load(tmp_path: Path) -> None:
    """Caught by `validate`, and never reaches a pass (where it crashed every start)."""
    text = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: llm}\nspec:\n"
    write(tmp_path, "llm.yaml", text + "  engine: vllm\n  basePort: 9000\n")
    result = load([tmp_path])
    message = only_error(result)
    assert message.startswith(f"{tmp_path / 'llm.yaml'}:4: spec.model: engine 'vllm' needs")
    assert "llm" in result.invalid_names and not result.entries


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param(
            "  devices:\n    count: on\n",
            "bad.yaml:9: spec.devices.count: Input should be a number, not true (YAML reads",
            id="yaml-boolean-is-no-count",
        ),
        pytest.param(
            "  args: [--x, true]\n",
            "bad.yaml:8: spec.args[1]: Input should be a valid string",
            id="list-index-in-the-path",
        ),
        pytest.param(
            "  readiness: probe\n",
            "bad.yaml:8: spec.readiness: Input should be a mapping of fields, not str",
            id="not-a-mapping-in-our-words",
        ),
        pytest.param(
            "  env: {BAD-NAME: x}\n",
            "bad.yaml:8: spec.env: env name 'BAD-NAME' is not a valid environment variable name",
            id="validator-message-without-pydantic-prefix",
        ),
        pytest.param(
            "  readiness:\n    httpGet: {}\n    tcpSocket: {}\n",
            "bad.yaml:8: spec.readiness: readiness takes httpGet or tcpSocket, not both",
            id="a-model-check-points-at-its-mapping",
        ),
    ],
)
def test_validation_errors_name_the_path_as_written(
    tmp_path: Path, extra: str, expected: str
) -> None:
    """pydantic's loc holds its own step names and snake_case: the user sees camelCase keys,
    list indexes and the line, as they wrote them."""
    write(tmp_path, "bad.yaml", GOOD.format(name="a") + extra)
    message = only_error(load([tmp_path]))
    assert message.startswith(str(tmp_path / expected.split(":")[0]))
    assert expected in message, message


def _with(name: str, extra: str) -> str:
    return GOOD.format(name=name) + extra


def test_one_model_in_two_deployments_is_a_pool(tmp_path: Path) -> None:
    """Two llama-servers of one model (one per GPU, as users ran them by hand) both load."""
    write(tmp_path, "a.yaml", _with("llm-a", "  model: /m/tiny.gguf\n"))
    write(tmp_path, "b.yaml", _with("llm-b", "  model: /m/tiny.gguf\n  aliases: [tiny]\n"))
    write(tmp_path, "c.yaml", _with("llm-c", "  aliases: [/m/tiny.gguf]\n"))  # joins the pool
    result = load([tmp_path])
    assert result.ok, [str(e) for e in result.errors]
    assert sorted(result.entries) == ["llm-a", "llm-b", "llm-c"]


@pytest.mark.parametrize(
    ("b_extra", "field", "why"),
    [
        ("  aliases: [shared]\n", "spec.aliases", "an alias of two deployments"),
        ("  model: llm-a\n", "spec.model", "metadata.name and another's model or alias"),
        ("  aliases: [llm-a]\n", "spec.aliases", "metadata.name and another's model or alias"),
    ],
    ids=["alias-twice", "model-is-a-name", "alias-is-a-name"],
)
def test_real_ambiguity_is_an_error_naming_both_files(
    tmp_path: Path, b_extra: str, field: str, why: str
) -> None:
    a = write(tmp_path, "a.yaml", _with("llm-a", "  aliases: [shared]\n"))
    b = write(tmp_path, "b.yaml", _with("llm-b", b_extra))
    result = load([tmp_path])
    assert not result.entries and set(result.invalid_names) == {"llm-a", "llm-b"}
    messages = [str(e) for e in result.errors]
    assert any(m.startswith(f"{b}:1: {field}: ") and why in m and str(a) in m for m in messages)
    assert any(m.startswith(f"{a}:1: ") and str(b) in m for m in messages), messages


@pytest.mark.parametrize(
    ("extra", "where", "expected"),
    [
        pytest.param(
            "  env: {SHA: " + "0" * 64 + "}\n",
            "spec.env.SHA",
            f'the engine would get "0": YAML reads {"0" * 64} as the number 0: '
            f'quote it ("{"0" * 64}")',
            id="a-sha256-of-zeros",
        ),
        pytest.param(
            "  args:\n    - --mode\n    - 0755\n",
            "spec.args",
            'the engine would get "493": YAML reads 0755 as the number 493: quote it ("0755")',
            id="an-octal-mode",
        ),
        pytest.param(
            "  env: {THREADS: 8, VERSION: 1.10}\n",
            "spec.env.VERSION",
            'the engine would get "1.1": YAML reads 1.10 as the number 1.1: quote it ("1.10")',
            id="a-version",
        ),
    ],
)
def test_a_number_the_engine_would_get_other_than_written_is_refused(
    tmp_path: Path, extra: str, where: str, expected: str
) -> None:
    """`env: {MODE: 0755}` reached the engine as MODE=493, `1.10` as 1.1, a sha256 of zeros
    as 0, silently; a number written as it reads (8) is still taken as its text."""
    write(tmp_path, "bad.yaml", GOOD.format(name="a") + extra)
    result = load([tmp_path])
    message = only_error(result)
    assert message.endswith(f": {where}: {expected}"), message
    assert "a" in result.invalid_names and not result.entries
    write(tmp_path, "bad.yaml", GOOD.format(name="a") + "  env: {THREADS: 8}\n")
    assert load([tmp_path]).entries["a"].deployment.spec.env == {"THREADS": "8"}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param(
            "  args: [--port-file, {port}]\n",
            "spec.args[1]: Input should be a valid string: YAML reads {port} unquoted as a "
            'mapping: quote it ("{port}")',
            id="unquoted-placeholder",
        ),
        pytest.param(
            "  env: {DEBUG: true}\n",
            "spec.env.DEBUG: Input should be a valid string: YAML reads an unquoted true "
            "(yes/no/on/off) as a boolean: quote it",
            id="boolean-where-text-goes",
        ),
        pytest.param(
            "  env: {RELEASE: 2026-12-06}\n",
            "spec.env.RELEASE: Input should be a valid string: YAML reads 2026-12-06 as a date: "
            'quote it ("2026-12-06")',
            id="date-where-text-goes",
        ),
        pytest.param(  # the hint said quote it ("0"): another sha256 than the one written
            "  source: {url: http://127.0.0.1/m.gguf, sha256: " + "0" * 64 + "}\n",
            f"spec.source.sha256: Input should be a valid string: YAML reads {'0' * 64} as the "
            f'number 0: quote it ("{"0" * 64}")',
            id="a-sha256-of-zeros-where-text-goes",
        ),
        pytest.param(
            "  env: {RELEASE: 2026-13-45}\n",
            "invalid YAML: '2026-13-45' reads as a timestamp in YAML but is none (month must be "
            "in 1..12): quote it",
            id="no-date-where-yaml-sees-one",
        ),
        pytest.param(
            "  env: {BIG: " + "9" * 5000 + "}\n",
            "invalid YAML: a number of 5000 digits, too long to read: quote it",
            id="a-number-python-will-not-read",
        ),
        pytest.param(
            "  env: {TOKEN: }\n",
            "spec.env.TOKEN: Input should be a valid string: the value is empty (or null): "
            'give one, quoted ("") for an empty string',
            id="empty-where-text-goes",
        ),
        pytest.param(
            "  env: [HF_HOME=/data/hf, A=b=c]\n",
            "spec.env: Input should be a valid dictionary: a mapping, not KEY=VALUE items: "
            'write env: {HF_HOME: "/data/hf", A: "b=c"}',
            id="env-as-docker-list",
        ),
        pytest.param(
            "  env:\n    - name: HF_TOKEN\n      value: hf_Secret0123456789\n"
            "    - {name: MODE, value: fast}\n",
            "spec.env: Input should be a valid dictionary: a mapping NAME: value, not "
            "Kubernetes' list of name/value items: write env: "
            '{HF_TOKEN: "<redacted>", MODE: "fast"}',
            id="env-as-kubernetes-list",
        ),
        pytest.param(
            "  env: {HF_TOKEN: {value: hf_Secret0123456789}}\n",
            "spec.env.HF_TOKEN: Input should be a valid string: Kubernetes' {value: ...} "
            "shape: write HF_TOKEN: VALUE, the value alone",
            id="env-value-as-kubernetes-mapping",
        ),
        pytest.param(
            "  env:\n    - name: HF_TOKEN\n      valueFrom: {secretKeyRef: {name: hf, key: t}}\n",
            "spec.env: Input should be a valid dictionary: Kubernetes' valueFrom (a Secret, a "
            "ConfigMap) is not read here: put the value in a file spec.envFrom reads",
            id="env-value-from-a-kubernetes-secret",
        ),
        pytest.param(
            "  env: [HF_TOKEN=hf_Secret0123456789, HF_HOME=/data/hf]\n",
            'write env: {HF_TOKEN: "<redacted>", HF_HOME: "/data/hf"}',
            id="env-as-docker-list-with-a-secret",
        ),
        pytest.param(
            "  devices: 1\n",
            "spec.devices: Input should be a mapping of fields, not int: write devices: {count: 1}",
            id="devices-as-a-count",
        ),
        pytest.param(
            "  devices: {count: 0.5}\n",
            "spec.devices.count: Input should be a valid integer, got a number with a fractional "
            "part: a whole number of devices; to share one, give the memory each engine needs "
            "of it (devices: {count: 1, memory: 20Gi}): engines are then packed by memory",
            id="half-a-gpu",
        ),
        pytest.param(
            "  readiness: {httpGet: /health}\n",
            "spec.readiness.httpGet: Input should be a mapping of fields, not str: write "
            'httpGet: {path: "/health"}',
            id="httpget-as-a-path",
        ),
        pytest.param(
            "  container: docker.io/vllm/vllm-openai:v0.11.0\n",
            'write container: {image: "docker.io/vllm/vllm-openai:v0.11.0"}',
            id="container-as-an-image",
        ),
        pytest.param(
            "  envFrom:\n    file: /etc/hf.env\n",
            "spec.envFrom: Input should be a list, not dict: start each item with '- '",
            id="list-written-as-its-item",
        ),
        pytest.param(
            "  aliases: llama3\n",
            'spec.aliases: Input should be a list, not str: write aliases: ["llama3"]',
            id="list-written-as-a-word",
        ),
        pytest.param(
            "  host: localhost:8000\n",
            "spec.host: host 'localhost:8000' is not an address to bind: an IP address or a "
            "host name, without a scheme or a port (the port is spec.port or spec.basePort): "
            'write host: "localhost"',
            id="host-with-a-port",
        ),
        pytest.param(
            "  host: http://0.0.0.0\n",
            "is not an address to bind: an IP address or a host name, without a scheme or a port "
            '(the port is spec.port or spec.basePort): write host: "0.0.0.0"',
            id="host-as-a-url",
        ),
        pytest.param(
            "  readinessProbe: {httpGet: {path: /health}}\n",
            "spec.readinessProbe: unknown field: reconcile's is `readiness`",
            id="kubernetes-field-name",
        ),
        pytest.param(
            "  environment: {A: b}\n",
            "spec.environment: unknown field: reconcile's is `env`",
            id="compose-field-name",
        ),
        pytest.param(
            "  envFrom: [{fiel: /etc/hf.env}]\n",
            "spec.envFrom[0].fiel: unknown field: did you mean `file`?",
            id="a-misspelt-field-in-a-list-item",
        ),
        pytest.param(
            "  gpus: 1\n",
            "spec.gpus: unknown field: reconcile's is `devices.count`",
            id="gpus-field",
        ),
        pytest.param(
            "  labels: {team: a}\n",
            "spec.labels: unknown field: reconcile's is `metadata.labels`",
            id="labels-under-spec",
        ),
        pytest.param(
            '  container: {image: "docker.io/vllm/vllm-openai:v0.11.0 "}\n',
            "spec.container.image: image 'docker.io/vllm/vllm-openai:v0.11.0 ' is not an image "
            "reference: spaces around it: write image: docker.io/vllm/vllm-openai:v0.11.0",
            id="image-with-a-pasted-space",
        ),
        pytest.param(
            "  container: {image: https://Docker.io/vllm/vllm-openai:v0.11.0}\n",
            "is not an image reference: a URL's scheme (an image reference has none) and upper "
            "case in its name: write image: docker.io/vllm/vllm-openai:v0.11.0",
            id="image-as-a-url",
        ),
        pytest.param(
            "  container: {image: vllm/vllm-openai@sha256:abc123}\n",
            "is not an image reference: its digest must be sha256: and 64 lower-case hex digits",
            id="image-with-a-short-digest",
        ),
        pytest.param(
            "  devices: {count: 1}\n".replace("count: 1", "count: 1, gpus: 1"),
            "spec.devices.gpus: unknown field (check the spelling",
            id="a-table-name-only-where-it-was-meant",
        ),
    ],
)
def test_a_wrong_shape_says_what_to_write(tmp_path: Path, extra: str, expected: str) -> None:
    """The YAML slips people make (an unquoted `{port}` or `true`, `devices: 1`, env as
    KEY=VALUE items, another tool's field name) each get the line to write instead."""
    write(tmp_path, "bad.yaml", GOOD.format(name="a") + extra)
    message = only_error(load([tmp_path]))
    assert expected in message, message
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:8: "), message
    assert "Secret0123456789" not in message  # a token written inline is never echoed


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param(
            "apiVersion: v1\n",
            "bad.yaml:1: apiVersion: Input should be 'reconcile/v1', not 'v1'",
            id="kubernetes-habit",
        ),
        pytest.param(
            "apiVersion: reconcile/v2\n",
            "bad.yaml:1: apiVersion: Input should be 'reconcile/v1', not 'reconcile/v2': did "
            "you mean `reconcile/v1`?",
            id="another-version",
        ),
        pytest.param(
            "",
            "bad.yaml:1: apiVersion: Field required: add `apiVersion: reconcile/v1`",
            id="left-out",
        ),
    ],
)
def test_a_manifest_with_a_wrong_api_version_is_checked_as_one(
    tmp_path: Path, header: str, expected: str
) -> None:
    """A document with `spec.engine` is ours whatever its apiVersion says: its error is that
    field's (not "keep Kubernetes objects out"), every other error of it is said too, and
    its deployment is known, so `status` shows it invalid instead of the file broken."""
    text = GOOD.format(name="web").replace("apiVersion: reconcile/v1\n", header)
    write(tmp_path, "bad.yaml", text.replace("engine: command", "engine: comand"))
    result = load([tmp_path])
    messages = [str(e) for e in result.errors]
    assert any(expected in m for m in messages), messages
    assert any("spec.engine:" in m and "did you mean `command`?" in m for m in messages)
    assert "web" in result.invalid_names and not result.broken_sources


HEAD = (
    "apiVersion: reconcile/v1\nkind: Deployment\nmetadata:\n  name: a\nspec:\n  engine: command\n"
)


SLIPS = [
    ('  command: [serve, "{port}"]\n  basePort:8000\n', 8,
     "(a key needs ': ', a colon and a space: write `basePort: 8000`)", "key-without-its-space"),
    ('  command: [serve, "{port}"]\n  just some words\n  port: 8000\n', 8,
     "(this line is neither `key: value` nor a list item `- value`)", "a-line-of-words"),
    ('  command: [serve, "{port}]\n', 7,
     "(a quote opened on line 7 is never closed)", "quote-never-closed"),
    ('  command: [serve, "{port}"]\n  env:\n    MSG: hello: world\n', 9,
     '(a value with ": " in it needs quotes: `MSG: "hello: world"`)', "colon-in-a-value"),
    ('  command: [serve, "{port}"]\n  env:\n    A: b\n     B: c\n', 10,
     "(this line is indented deeper than the key above it: the keys of one mapping line up)",
     "indented-deeper"),
    ('  command: [serve, "{port}"]\n env: {}\n', 8,
     "(this line is not indented as the keys above it: the keys of one mapping line up)",
     "indented-less"),
    ('  command: [serve, "{port}"]\n  env: {A: b\n  port: 8000\n', 9,
     "(the '{' opened on line 8 is never closed", "brace-never-closed"),
    ("  command: *argv\n", 7,
     "(an alias *name needs its anchor &name above it in the same document; anchors do not "
     "carry over '---')", "alias-of-no-anchor"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "line", "hint"), [pytest.param(b, n, h, id=i) for b, n, h, i in SLIPS]
)
def test_a_yaml_slip_is_named_on_its_line(tmp_path: Path, body: str, line: int, hint: str) -> None:
    """PyYAML names its parser's state ("mapping values are not allowed in this context"),
    often on the line after the slip (past the end, for a quote never closed): the error
    names the slip, on the line it is on, and what to write."""
    write(tmp_path, "bad.yaml", HEAD + body)
    write(tmp_path, "good.yaml", GOOD.format(name="good"))
    result = load([tmp_path])
    message = only_error(result)
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:{line}: invalid YAML: "), message
    assert hint in message, message  # after PyYAML's own words (libyaml's or its own)
    assert "good" in result.entries


def test_a_colon_in_a_flow_item_says_to_quote_it(tmp_path: Path) -> None:
    write(tmp_path, "bad.yaml", HEAD + "  command: [python3, -c, import os: 1]\n")
    message = only_error(load([tmp_path]))
    assert message.startswith(
        f"{tmp_path / 'bad.yaml'}:7: spec.command[2]: Input should be a valid string: YAML "
        "reads `import os: 1` as a mapping (': ' in an unquoted item): quote it"
    ), message


def test_a_folder_with_no_manifest_says_what_looks_meant_as_one(tmp_path: Path) -> None:
    """Manifests one folder down, or named web.YAML or web.json, are skipped as they
    should be; "holds no manifest" then names them, so the puzzle has its answer."""
    (tmp_path / "m" / "engines").mkdir(parents=True)
    write(tmp_path / "m" / "engines", "web.yaml", GOOD.format(name="web"))
    write(tmp_path / "m", "api.YAML", GOOD.format(name="api"))
    write(tmp_path / "m", "db.json", "{}")
    result = load([tmp_path / "m"])
    assert not result.entries and not result.prune_safe
    assert result.no_manifest == (
        f"no manifest in {tmp_path / 'm'} ({tmp_path / 'm' / 'engines'} holds 1: -f reads one "
        f"folder, not its subfolders; api.YAML in {tmp_path / 'm'}: the suffix is lower-case "
        f".yaml or .yml; db.json in {tmp_path / 'm'}: manifests are YAML files (.yaml, .yml))"
    )
    write(tmp_path / "m", "web.yaml", GOOD.format(name="web"))
    assert load([tmp_path / "m"]).no_manifest == ""  # a manifest found: nothing to explain


def test_a_folder_with_no_manifest_names_itself_and_what_it_passed_over(tmp_path: Path) -> None:
    """`validate` on a folder of a README said "0 deployment(s) in 0 file(s): valid": what
    it holds instead, and which folder, is what the user needs to see."""
    (tmp_path / "m").mkdir()
    assert load([tmp_path / "m"]).no_manifest == f"no manifest in {tmp_path / 'm'} (it is empty)"
    write(tmp_path / "m", "README.md", "docs")
    write(tmp_path / "m", "notes.txt", "notes")
    write(tmp_path / "m", ".gitkeep", "")  # hidden: passed over without a word
    write(tmp_path / "m", "web.yaml", "# all commented out\n")
    assert load([tmp_path / "m"]).no_manifest == (
        f"no manifest in {tmp_path / 'm'} (ignored README.md, notes.txt: manifests are .yaml "
        "or .yml files; no document in web.yaml: blank or only comments)"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            '  args: [--ctx-size, "4096", "-ngl 99"]\n',
            "spec.args: a flag and its value in one item (a space between them): no shell "
            "splits it, so the engine would get it whole and refuse it; write two items: "
            '[-ngl, "99"]',
            id="args",
        ),
        pytest.param(
            '  args: ["--api-key sk-Secret0123456789"]\n',
            'write two items: [--api-key, "<redacted>"]',
            id="a-secret-flag",
        ),
    ],
)
def test_a_flag_and_its_value_in_one_argv_item_is_refused_on_its_line(
    tmp_path: Path, argv: str, expected: str
) -> None:
    """`"--ctx-size 4096"` reached the engine as one word (no shell splits it), which it
    refused at its start; `"--port 9000"` so written passed the recipe's own-flags check."""
    write(tmp_path, "bad.yaml", GOOD.format(name="a") + argv)
    message = only_error(load([tmp_path]))
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:8: "), message
    assert expected in message and "Secret0123456789" not in message, message


def test_a_flag_and_its_value_in_one_command_item_is_refused(tmp_path: Path) -> None:
    body = GOOD.format(name="a").replace('"{port}"]', '"{port}", "--threads 4"]')
    write(tmp_path, "bad.yaml", body)
    message = only_error(load([tmp_path]))
    assert message.startswith(f"{tmp_path / 'bad.yaml'}:7: spec.command: a flag and its"), message
    assert 'write two items: [--threads, "4"]' in message, message


def test_an_item_after_a_flag_may_be_its_value_with_spaces(tmp_path: Path) -> None:
    """`--extra-args "-x 1"`: the item may be the flag's value, so it is left be; so is a
    flag=value whose value has a space, and command's program (a path may have one)."""
    body = GOOD.format(name="a").replace("[serve,", '["-my serve",')
    write(tmp_path, "ok.yaml", body + '  args: [--extra-args, "-x 1", "--title=a b"]\n')
    result = load([tmp_path])
    assert not result.errors and "a" in result.entries, [str(e) for e in result.errors]


def test_a_documents_errors_come_in_the_files_order(tmp_path: Path) -> None:
    """pydantic reports by the model's fields (args, env, then devices, port): validate
    listed lines 12, 13, 9, 8; a reader goes down the file, and status shows the first."""
    body = GOOD.format(name="a") + (
        "  port: abc\n  devices: {count: two}\n  args: --ctx-size 4096\n  env: {B: true}\n"
    )
    write(tmp_path, "bad.yaml", body)
    result = load([tmp_path])
    lines = [error.line for error in result.errors]
    assert lines == [8, 9, 10, 11], [str(e) for e in result.errors]
    assert result.invalid_names["a"].startswith(f"{tmp_path / 'bad.yaml'}:8: spec.port:")
