"""Secret values in a site config's ``build.env`` (hpcstack/secrets.py): the schema takes them,
and the dry-run (bash and JSON) names where they are read from, never the value.
(The install itself, and every file it writes: test_secrets_install.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, make_sdist, write_tiny_recipe
from hpcstack.cli import main
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack import secrets
from hpcstack.site import check_config

pytestmark = pytest.mark.unit

ENV_VALUE = "s3cr3t-from-env-Zq81"
FILE_VALUE = "s3cr3t-from-file-Kp27"


def site_with_secrets(root: Path, token_file: Path) -> Path:
    site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    site["python"] = {"version": "3.11"}          # a dry-run that loads no module
    site.setdefault("build", {})["env"] = {
        "TOKEN": {"secret": True, "from_env": "MY_TOKEN"},
        "FILE_TOKEN": {"secret": True, "from_file": str(token_file)},
        "PLAIN": "-O2 -g"}
    path = root / "secret-site.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


@pytest.mark.parametrize("value, ok", [
    ({"secret": True, "from_env": "MY_TOKEN"}, True),
    ({"secret": True, "from_file": "/etc/hpcstack/token"}, True),
    ({"secret": True}, False),                                   # read from where?
    ({"secret": True, "from_env": "A", "from_file": "/x"}, False),
    ({"secret": False, "from_env": "A"}, False),
    ({"secret": True, "from_env": "BAD;NAME"}, False),
    ({"secret": True, "from_file": "/x\nexport Y=1"}, False),
    ({"secret": True, "value": "inline"}, False),
])
def test_schema_takes_secret_specifications_only(value, ok):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["build"]["env"] = {"TOKEN": value}
    assert (check_config(data, "s.yaml") == []) is ok


def test_dry_run_names_the_source_never_the_value(tmp_path, capsys, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text(FILE_VALUE + "\n")
    monkeypatch.setenv("MY_TOKEN", ENV_VALUE)
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    site = site_with_secrets(tmp_path, token_file)
    args = ["install", str(recipe), "--site", str(site), "--prefix", str(tmp_path / "sw"),
            "--module-root", str(tmp_path / "mf"), "--dry-run"]
    assert main(args) == 0
    script = capsys.readouterr()
    assert main([*args, "--json"]) == 0
    plan = capsys.readouterr()
    for out in (script.out, script.err, plan.out, plan.err):
        assert ENV_VALUE not in out and FILE_VALUE not in out
    assert 'TOKEN="${MY_TOKEN}"' in script.out and 'FILE_TOKEN="${HPCSTACK_SECRET_FILE_TOKEN}"' in script.out
    assert f"HPCSTACK_SECRET_FILE_TOKEN=\"$(head -n1 {token_file})\"" in script.out
    assert "PLAIN='-O2 -g'" in script.out
    # the dry-run script reads the file when it runs: bash expands what the plan holds
    preamble = [line for line in script.out.splitlines() if line.startswith("HPCSTACK_SECRET_")]
    proc = subprocess.run(["bash", "-c", "\n".join(preamble) + '\nprintf %s "$HPCSTACK_SECRET_FILE_TOKEN"'],
                          capture_output=True, text=True)
    assert proc.stdout == FILE_VALUE


def test_read_gives_one_line_per_missing_secret_without_values(tmp_path):
    specs = {"TOKEN": {"secret": True, "from_env": "MY_TOKEN"},
             "FILE_TOKEN": {"secret": True, "from_file": str(tmp_path / "missing")}}
    with pytest.raises(HpcstackError) as exc:
        secrets.read(specs, {}, "s.yaml")
    text = str(exc.value)
    assert "build.env.TOKEN: the secret's variable MY_TOKEN is not set" in text
    assert f"build.env.FILE_TOKEN: cannot read the secret's file {tmp_path / 'missing'}" in text
    (tmp_path / "missing").write_text(FILE_VALUE + "\n")
    assert secrets.read(specs, {"MY_TOKEN": ENV_VALUE}, "s.yaml") == {"HPCSTACK_SECRET_FILE_TOKEN": FILE_VALUE}


@pytest.mark.integration  # the easyconfig export reads the index (PyPI)
def test_an_easyconfig_reads_the_secrets_when_easybuild_runs(tmp_path, capsys, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text(FILE_VALUE + "\n")
    monkeypatch.setenv("MY_TOKEN", ENV_VALUE)
    out = tmp_path / "eb" / "pytorch.eb"
    out.parent.mkdir()
    assert main(["export", "pytorch/2.3.1-gpu", "--site", str(site_with_secrets(tmp_path, token_file)),
                 "--format", "easyconfig", "-o", str(out)]) == 0
    text = out.read_text()
    assert ENV_VALUE not in text and FILE_VALUE not in text
    flat = "".join(line.strip().strip("'\"") for line in text.splitlines())
    assert 'TOKEN="${MY_TOKEN}"' in flat and f'FILE_TOKEN="$(head -n1 {token_file})"' in flat.replace("' '", "")


# ------------------------------------------------------------- no secret in a build key (rule 2)

@pytest.mark.parametrize("env, name", [
    ({"LDFLAGS": {"secret": True, "from_env": "MY_TOKEN"}}, "LDFLAGS"),                  # a key variable itself
    ({"HOROVOD_TOKEN": {"secret": True, "from_file": "/etc/hpcstack/t"}}, "HOROVOD_TOKEN"),
    ({"TOKEN": {"secret": True, "from_env": "CFLAGS"}}, "TOKEN"),                         # read from one
    ({"TOKEN": {"secret": True, "from_env": "MY_TOKEN"}, "CFLAGS": "-O2 ${MY_TOKEN}"}, "CFLAGS"),  # expanded in one
    ({"FT": {"secret": True, "from_file": "/etc/hpcstack/t"}, "CC": "gcc -DT=$HPCSTACK_SECRET_FT"}, "CC"),
])
def test_a_secret_in_a_build_key_variable_is_refused_with_the_reason(tmp_path, capsys, monkeypatch, env, name):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["python"] = {"version": "3.11"}
    data["build"]["env"] = env
    lines = check_config(data, "s.yaml")
    assert len(lines) == 1 and lines[0].startswith(f"s.yaml: build.env.{name}: ")
    assert "build-key variable" in lines[0] and "build cache" in lines[0]
    # the command refuses it in one line, exit 2, before anything is read or written
    monkeypatch.setenv("MY_TOKEN", ENV_VALUE)
    site = tmp_path / "s.yaml"
    site.write_text(yaml.safe_dump(data))
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    assert main(["install", str(recipe), "--site", str(site), "--prefix", str(tmp_path / "sw"), "--dry-run"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.splitlines()) == 1 and f"build.env.{name}" in out.err
    assert ENV_VALUE not in out.err and not (tmp_path / "sw").exists()


def test_a_secret_inside_another_value_keeps_that_variable_out_of_the_key(tmp_path, capsys, monkeypatch):
    """``TOKEN_URL: https://ci:${MY_TOKEN}@…`` is secret too: it stays out of the build key's
    variables (the key's text is logged and cached), as the secret does; a plain value stays in."""
    monkeypatch.setenv("MY_TOKEN", ENV_VALUE)
    token_file = tmp_path / "token"
    token_file.write_text(FILE_VALUE + "\n")
    site = site_with_secrets(tmp_path, token_file)
    data = yaml.safe_load(site.read_text())
    data["build"]["env"]["TOKEN_URL"] = "https://ci:${MY_TOKEN}@example.invalid/simple"
    site.write_text(yaml.safe_dump(data))
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    assert main(["install", str(recipe), "--site", str(site), "--prefix", str(tmp_path / "sw"), "--dry-run"]) == 0
    script = capsys.readouterr().out
    keys = [line for line in script.splitlines() if "grep -E '^(" in line]
    assert keys and all("PLAIN" in line for line in keys)
    assert not any(n in line for line in keys for n in ("TOKEN_URL", "FILE_TOKEN", "|TOKEN"))
    assert ENV_VALUE not in script and FILE_VALUE not in script


def test_the_dry_run_replaces_a_value_wherever_it_shows(tmp_path, capsys, monkeypatch):
    """Redaction is by value: a secret's value that reaches the plan by another way (here the
    install root's name) is printed as the marker, in the script and in --json."""
    monkeypatch.setenv("MY_TOKEN", ENV_VALUE)
    token_file = tmp_path / "token"
    token_file.write_text(FILE_VALUE + "\n")
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    args = ["install", str(recipe), "--site", str(site_with_secrets(tmp_path, token_file)),
            "--prefix", str(tmp_path / f"sw-{FILE_VALUE}"), "--dry-run"]
    for extra in ([], ["--json"]):
        assert main([*args, *extra]) == 0
        out = capsys.readouterr().out
        assert FILE_VALUE not in out and f"sw-{secrets.MARKER}" in out


def test_the_redactor_replaces_values_in_a_log_that_commands_write_and_in_errors(tmp_path):
    redactor = secrets.Redactor([ENV_VALUE, FILE_VALUE, ""])
    path = tmp_path / "build.log"
    with open(path, "w") as raw:
        log = redactor.stream(raw)
        log.write(f"# hpcstack: {ENV_VALUE}\n")
        # a command's output straight to the log's descriptor, one value cut across two writes
        half = len(FILE_VALUE) // 2
        subprocess.run(["sh", "-c", f"printf %s {FILE_VALUE[:half]}; sleep 0.3; printf '%s\\n' {FILE_VALUE[half:]}; "
                        f"echo {ENV_VALUE}-tail >&2"], stdout=log, stderr=subprocess.STDOUT, check=True)
        log.write("end\n")
        log.close()
    text = path.read_text()
    assert ENV_VALUE not in text and FILE_VALUE not in text
    assert text.splitlines() == [f"# hpcstack: {secrets.MARKER}", secrets.MARKER, f"{secrets.MARKER}-tail", "end"]
    err = redactor.error(HpcstackError(f"`setup.py --token {ENV_VALUE}` exited with status 1", step="build"))
    assert err.lines() == [f"step build: `setup.py --token {secrets.MARKER}` exited with status 1"]
    assert err.exit_status == 1
    conf = redactor.error(ConfigError([f"a {FILE_VALUE}", "b"]))
    assert conf.lines() == [f"a {secrets.MARKER}", "b"] and conf.exit_status == 2
    assert secrets.Redactor([]).text(ENV_VALUE) == ENV_VALUE


# ------------------------------------------------------------- whose file a secret is read from

def _file_spec(path: Path) -> dict:
    return {"FILE_TOKEN": {"secret": True, "from_file": str(path)}}


@pytest.mark.parametrize("where", ["the file", "a directory above it"])
def test_a_secret_file_another_account_can_change_is_refused_before_it_is_read(tmp_path, where):
    """The install reads a ``from_file`` secret as root into the environment of all it runs: a
    file that every user can write, or one in a directory every user can write (a swap), is
    refused in one line naming it and who can change it, without its value; with
    --trust-writable (the control) the same file is read."""
    from hpcstack import trust

    holder = tmp_path / "open"
    holder.mkdir()
    token = holder / "token"
    token.write_text(FILE_VALUE + "\n")
    if where == "the file":
        token.chmod(0o666)
        said = "writable by every user"
    else:
        holder.chmod(0o777)                     # no sticky bit: anyone can rename the file away
        said = f"{holder}: writable by every user"
    with pytest.raises(ConfigError) as exc:
        secrets.read(_file_spec(token), {}, "s.yaml")
    assert len(exc.value.lines()) == 1
    line = exc.value.lines()[0]
    assert line.startswith(f"s.yaml: build.env.FILE_TOKEN: the secret's file {token}: {said}; ")
    assert FILE_VALUE not in line
    assert secrets.known_values(_file_spec(token), {}) == []          # not read for redaction either
    loose = trust.Policy(uid=os.geteuid(), trust_writable=True)
    assert secrets.read(_file_spec(token), {}, "s.yaml", loose) == {"HPCSTACK_SECRET_FILE_TOKEN": FILE_VALUE}


def test_a_secret_file_is_read_through_a_trusted_link_and_never_from_a_fifo(tmp_path):
    """A link in a trusted directory to a trusted file is read (the resolved path, through the
    gate); a FIFO is refused at once (not waited on), as is a file too large to be a secret."""
    token = tmp_path / "token"
    token.write_text(FILE_VALUE + "\nsecond line\n")
    (tmp_path / "link").symlink_to(token)
    assert secrets.read(_file_spec(tmp_path / "link"), {}, "s.yaml") == {"HPCSTACK_SECRET_FILE_TOKEN": FILE_VALUE}
    assert secrets.known_values(_file_spec(tmp_path / "link"), {}) == [FILE_VALUE]
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(HpcstackError, match="the secret's file .*fifo: refused: not a regular file"):
        secrets.read(_file_spec(tmp_path / "fifo"), {}, "s.yaml")
    (tmp_path / "big").write_text("x" * (secrets.MAX_SECRET_FILE + 1))
    with pytest.raises(HpcstackError, match="refused: larger than"):
        secrets.read(_file_spec(tmp_path / "big"), {}, "s.yaml")
