"""Spot and preemption notices (`gpusnap run --notices`), against a fake metadata service on
127.0.0.1 that speaks each cloud's protocol (AWS IMDSv2 with its session token, GCP with its
Metadata-Flavor header, Azure Scheduled Events with its Metadata header) and refuses requests
without the headers the real services demand."""

from __future__ import annotations

import email.utils
import json
import re
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from harness import Run, copy_programs, gpusnap, plain, progress, ref_and_out, snapshots, wait_for

from gpusnap import knobs
from gpusnap.launch import notices

TOKEN = "fake-imds-token"


class FakeMetadata(ThreadingHTTPServer):
    """``present``: the clouds whose service answers; ``armed``: provider -> seconds from now
    to the deadline of its notice."""

    def __init__(self, present=notices.PROVIDERS):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.present, self.armed = set(present), {}
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        if self.path == "/latest/api/token" and "aws" in self.server.present and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self._send(200, TOKEN.encode())
        self._send(404)

    def do_GET(self):
        armed = self.server.armed
        if self.path == "/latest/meta-data/spot/instance-action" and "aws" in self.server.present:
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                return self._send(401)
            if "aws" not in armed:
                return self._send(404)
            at = datetime.fromtimestamp(time.time() + armed["aws"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            return self._send(200, json.dumps({"action": "terminate", "time": at}).encode())
        if self.path == "/computeMetadata/v1/instance/preempted" and "gcp" in self.server.present:
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403)
            return self._send(200, b"TRUE" if "gcp" in armed else b"FALSE")
        if self.path.startswith("/metadata/scheduledevents?") and "azure" in self.server.present:
            if self.headers.get("Metadata") != "true":
                return self._send(400)
            events = []
            if "azure" in armed:
                events = [{"EventId": "1", "EventType": "Freeze", "NotBefore": ""},
                          {"EventId": "2", "EventType": "Preempt", "EventStatus": "Scheduled",
                           "NotBefore": email.utils.formatdate(time.time() + armed["azure"], usegmt=True)}]
            return self._send(200, json.dumps({"DocumentIncarnation": len(events), "Events": events}).encode())
        self._send(404)


@pytest.fixture
def metadata(monkeypatch):
    server = FakeMetadata()
    monkeypatch.setattr(knobs, "METADATA_URL", server.url)
    yield server
    server.shutdown()


@pytest.mark.parametrize("provider", notices.PROVIDERS)
def test_each_clouds_notice_is_read_with_its_deadline(metadata, provider):
    watcher = notices._WATCHERS[provider]()
    assert watcher.answers() and watcher.check() is None
    metadata.armed[provider] = 90
    notice = watcher.check()
    assert notice is not None and notice.provider == provider
    expected = time.time() + (90 if provider != "gcp" else 30)  # GCP gives no time: its documented 30 s
    assert abs(notice.deadline - expected) < 2, notice
    assert notice.action in ("terminate", "preemption", "preempt")


def test_auto_watches_the_service_that_answers_and_says_when_none_does(monkeypatch):
    server = FakeMetadata(present={"gcp"})
    monkeypatch.setattr(knobs, "METADATA_URL", server.url)
    monkeypatch.setattr(knobs, "NOTICE_POLL_S", 0.05)
    seen = []
    notices.Watcher("auto", seen.append, seen.append).start()
    server.armed["gcp"] = 30
    wait_for(lambda: seen, "the gcp notice", timeout=10)
    assert isinstance(seen[0], notices.Notice) and seen[0].provider == "gcp"
    server.present = set()
    quiet = []
    watcher = notices.Watcher("auto", quiet.append, quiet.append)
    watcher.start()
    watcher.thread.join(10)
    assert quiet == ["no cloud metadata service answered: spot notices are not watched"]
    server.shutdown()


@pytest.mark.parametrize("provider", notices.PROVIDERS)
def test_a_notice_snapshots_and_stops_with_75_and_the_run_continues_after_requeue(tmp_path, metadata, provider):
    program = copy_programs(tmp_path) / "notorch" / "counters.py"
    ref, out = ref_and_out(tmp_path)
    plain(program, ref, 300, cwd=tmp_path)
    env = {"GPUSNAP_METADATA_URL": metadata.url, "GPUSNAP_NOTICE_POLL_S": "0.1", "TEST_STEP_SLEEP_S": "0.02"}
    run = Run("run", "--dir", "snaps", "--notices", provider, program, out, 300, cwd=tmp_path, env=env)
    wait_for(lambda: progress(out) >= 20, "step 20", proc=run)
    metadata.armed[provider] = 60
    code, _, err = run.wait(timeout=120)
    assert code == 75, err
    assert f"{provider} " in err and "notice: the machine goes away at" in err, err
    assert progress(out) < 300 and len(snapshots(tmp_path / "snaps", tmp_path)) == 1
    log = [json.loads(line) for line in (tmp_path / "snaps" / "log.jsonl").read_text().splitlines()]
    assert [e["provider"] for e in log if e.get("event") == "notice"] == [provider]

    requeued = gpusnap("run", "--dir", "snaps", program, out, 300, cwd=tmp_path)  # the same command, after requeue
    assert requeued.returncode == 0, requeued.stderr
    assert (out / "final.json").read_text() == (ref / "final.json").read_text()


def test_a_deadline_sooner_than_the_grace_shortens_it(tmp_path, metadata):
    """AWS says 120 s, --grace says 10 min: the supervisor stops the program before the VM goes."""
    program = copy_programs(tmp_path) / "notorch" / "counters.py"
    _, out = ref_and_out(tmp_path)
    env = {"GPUSNAP_METADATA_URL": metadata.url, "GPUSNAP_NOTICE_POLL_S": "0.1", "TEST_STEP_SLEEP_S": "0.02"}
    run = Run("run", "--dir", "snaps", "--grace", "10m", "--notices", "aws", program, out, 300, cwd=tmp_path, env=env)
    wait_for(lambda: progress(out) >= 10, "step 10", proc=run)
    metadata.armed["aws"] = 20
    code, _, err = run.wait(timeout=120)
    assert code == 75, err
    grace = re.search(r"then stop \(grace ([\d.]+)s\)", err)  # 20 s less the 5 s margin, not 10 min
    assert grace and 10 < float(grace.group(1)) <= 15, err
