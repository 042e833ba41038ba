"""Storage locations on a local directory, a real S3-protocol server and a GCS emulator."""

from __future__ import annotations

import pytest

from cmdare.errors import StorageError, UserInputError
from cmdare.storage import MissingObjectError, Storage, run_storage, storage_root


def test_objects_round_trip(storage_url):
    st = Storage(storage_url)
    assert st.names() == []  # a location that does not exist yet is empty
    st.check_writable()
    st.put("b.json", b'{"x": 1}')
    st.put("a.bin", bytes(range(256)) * 100)
    assert st.names() == ["a.bin", "b.json"]
    assert st.names(suffix=".json") == ["b.json"] and st.names(prefix="a") == ["a.bin"]
    assert st.get("a.bin") == bytes(range(256)) * 100 and st.exists("b.json")
    st.put("b.json", b"{}")  # overwritten whole
    assert st.get("b.json") == b"{}"
    st.delete("b.json")
    st.delete("b.json")  # gone already: nothing happens
    assert st.names() == ["a.bin"] and not st.exists("b.json")
    with pytest.raises(MissingObjectError, match="does not exist"):
        st.get("b.json")
    child = st.child("control")
    child.put("r.json", b"1")
    assert st.names() == ["a.bin"] and child.names() == ["r.json"]  # a sub-location is not an object
    assert child.url("r.json") == f"{st.uri}/control/r.json"


def test_local_writes_leave_no_temporary_files(tmp_path):
    st = Storage(f"file://{tmp_path}/d")
    assert st.is_local and st.uri == str(tmp_path / "d")
    st.put("x", b"1")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x"]


def test_the_storage_root_follows_the_option_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("CMDARE_STORAGE", raising=False)
    assert storage_root().uri.endswith("/checkpoints")  # the data directory by default
    monkeypatch.setenv("CMDARE_STORAGE", str(tmp_path / "env"))
    assert storage_root().uri == str(tmp_path / "env")
    assert run_storage("run-1", str(tmp_path / "opt")).uri == str(tmp_path / "opt" / "run-1")


def test_a_missing_bucket_fails_in_one_line(s3):
    with pytest.raises(StorageError) as err:
        Storage("s3://no-such-bucket/runs").check_writable()
    assert "no-such-bucket" in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_protocol_or_options_are_user_errors(monkeypatch):
    with pytest.raises(UserInputError, match="nosuchproto"):
        Storage("nosuchproto://x/y").put("a", b"1")
    monkeypatch.setenv("CMDARE_STORAGE_OPTIONS", "{not json")
    with pytest.raises(UserInputError, match="CMDARE_STORAGE_OPTIONS"):
        Storage("s3://b/x")


def test_a_password_in_a_storage_url_shows_nowhere(tmp_path):
    """Issue 29: ``--storage sftp://alice:S3cretPW@...`` printed the password and stored it with the run."""
    from cmdare.errors import StorageError
    from cmdare.storage.location import mask_credentials
    from cmdare.train.spec import TrainSpec

    url = "sftp://alice:S3cretPW@127.0.0.1:1/runs"
    assert mask_credentials(url) == "sftp://alice:***@127.0.0.1:1/runs"
    assert mask_credentials(f"cannot reach {url} (and s3://k:v@b/p)") == \
        "cannot reach sftp://alice:***@127.0.0.1:1/runs (and s3://k:***@b/p)"
    assert mask_credentials("/a/b:c@d and s3://bucket/p and http://h:80/x") == "/a/b:c@d and s3://bucket/p and " \
        "http://h:80/x"
    storage = Storage(url)
    for shown in (storage.uri, str(storage), repr(storage), storage.url("x")):
        assert "S3cretPW" not in shown and "alice:***@" in shown
    with pytest.raises(StorageError) as failed:  # no SFTP client here, or nothing listening on port 1
        storage.child("run-1").check_writable()
    assert "S3cretPW" not in str(failed.value)
    stored = TrainSpec(storage=url).to_dict()  # what the store's runs.config, run.json and checkpoints keep
    assert stored["storage"] == "sftp://alice:***@127.0.0.1:1/runs" and "S3cretPW" not in str(stored)


def test_what_cmdare_creates_is_readable_by_its_owner_only(tmp_path, monkeypatch):
    """Issue 29: the store and checkpoints were world-readable (644, directories 755)."""
    import stat

    from cmdare.measure.store import open_store
    from cmdare.paths import checkpoint_root, data_dir

    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)

    monkeypatch.setenv("CMDARE_HOME", str(tmp_path / "home"))
    assert mode(data_dir()) == 0o700 and mode(checkpoint_root()) == 0o700
    storage = Storage(tmp_path / "runs" / "run-1")
    storage.put("manifest.json", b"{}")
    assert mode(tmp_path / "runs" / "run-1") == 0o700 and mode(tmp_path / "runs" / "run-1" / "manifest.json") == 0o600
    store = open_store(f"sqlite:///{tmp_path / 'store' / 'cmdare.db'}")
    store.engine.dispose()
    assert mode(tmp_path / "store" / "cmdare.db") == 0o600 and mode(tmp_path / "store") == 0o700


def test_a_run_that_stopped_without_an_end_reads_stale_and_refuses_control_requests(tmp_path):
    """Issue 29: a run killed with kill -9 stayed 'running' forever, and `cmdare ps add` answered 'requested'."""
    import time

    from cmdare.train.runtime.run_files import STALE_AFTER_S, heartbeat, read_status, request_change, write_status

    run = Storage(tmp_path / "run-k")
    heartbeat(run, 2, 340)
    status = read_status(run)
    assert (status["status"], status["global_step"], status["num_shards"]) == ("running", 340, 2)
    assert read_status(run, now=status["time"] + STALE_AFTER_S + 1)["status"] == "stale"
    data = run.get("status.json").replace(str(status["time"]).encode(), str(time.time() - STALE_AFTER_S - 5).encode())
    run.put("status.json", data)  # its coordinator's last beat, minutes ago
    with pytest.raises(UserInputError, match="run run-k is stale .*killed, or its machine lost.*resume it"):
        request_change(run, "add")
    write_status(run, "finished", 2, 400)
    with pytest.raises(UserInputError, match="run run-k is finished: cannot change its shards"):
        request_change(run, "add")
    run.put("status.json", b"[1, 2]")
    with pytest.raises(Exception, match="unreadable"):
        read_status(run)


def test_the_run_report_shows_a_silent_running_run_as_stale():
    from cmdare.measure.reports.run import STALE_AFTER_S, shown_status

    assert shown_status("running", 1000.0, 1000.0 + STALE_AFTER_S + 1) == "stale"
    assert shown_status("running", 1000.0, 1001.0) == "running"
    assert shown_status("finished", 1000.0, 1e12) == "finished"
