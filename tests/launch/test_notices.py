"""Spot and preemption notices (`gpusnap run --notices`), against a fake metadata service on
127.0.0.1 that speaks each cloud's protocol (AWS IMDSv2 with its session token, GCP with its
Metadata-Flavor header, Azure Scheduled Events with its Metadata header) and refuses requests
without the headers the real services demand."""

from __future__ import annotations

import email.utils
import json
import re
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from harness import Run, copy_programs, gpusnap, plain, progress, ref_and_out, snapshots, wait_for

from gpusnap import knobs
from gpusnap.launch import notices

TOKEN = "fake-imds-token"


class FakeMetadata(ThreadingHTTPServer):
    """``present``: the clouds whose service answers; ``armed``: provider -> seconds from now
    to the deadline of its notice; ``skew_s``: how far the service's clock (its Date header and
    its deadlines) is from this machine's; ``scripted``: path -> a function that answers a
    request to it in its own (broken) way."""

    daemon_threads = True

    def __init__(self, present=notices.PROVIDERS):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.present, self.armed, self.skew_s, self.scripted = set(present), {}, 0.0, {}
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address):
        # gpusnap hangs up on an answer too large or too slow (the broken services below): no
        # error of the service's, and no traceback in the test's output.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)  # with a Date header of this machine's clock...
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def date_time_string(self, timestamp=None):  # ...shifted to the service's
        return email.utils.formatdate(time.time() + self.server.skew_s, usegmt=True)

    def do_PUT(self):
        if self.path in self.server.scripted:
            return self.server.scripted[self.path](self)
        if self.path == "/latest/api/token" and "aws" in self.server.present and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self._send(200, TOKEN.encode())
        self._send(404)

    def do_GET(self):
        if self.path in self.server.scripted:
            return self.server.scripted[self.path](self)
        armed = self.server.armed
        now = time.time() + self.server.skew_s
        if self.path == "/latest/meta-data/spot/instance-action" and "aws" in self.server.present:
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                return self._send(401)
            if "aws" not in armed:
                return self._send(404)
            at = datetime.fromtimestamp(now + armed["aws"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
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
                           "NotBefore": email.utils.formatdate(now + armed["azure"], usegmt=True)}]
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
    expected = 90 if provider != "gcp" else 30  # GCP gives no time: its documented 30 s
    assert abs(notice.left_s - expected) < 2, notice
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


@pytest.mark.parametrize("provider", [p if p == notices.PROVIDERS[0] else pytest.param(p, marks=[pytest.mark.slow, pytest.mark.more])
                                      for p in notices.PROVIDERS])  # one provider by default; each parses its own (test_notices' unit tests)
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
    """AWS says 20 s, --grace says 10 min: the supervisor stops the program before the VM goes.
    The service's clock is an hour behind this machine's: the deadline is read against the
    service's own Date, and the grace counted on the monotonic clock (before, it came to 1 s)."""
    program = copy_programs(tmp_path) / "notorch" / "counters.py"
    _, out = ref_and_out(tmp_path)
    env = {"GPUSNAP_METADATA_URL": metadata.url, "GPUSNAP_NOTICE_POLL_S": "0.1", "TEST_STEP_SLEEP_S": "0.02"}
    run = Run("run", "--dir", "snaps", "--grace", "10m", "--notices", "aws", program, out, 300, cwd=tmp_path, env=env)
    wait_for(lambda: progress(out) >= 10, "step 10", proc=run)
    metadata.skew_s = -3600
    metadata.armed["aws"] = 20
    code, _, err = run.wait(timeout=120)
    assert code == 75, err
    grace = re.search(r"then stop \(grace ([\d.]+)s\)", err)  # 20 s less the 5 s margin, not 10 min
    assert grace and 10 < float(grace.group(1)) <= 15, err


# -- answers that are no notice -----------------------------------------------------------------

AWS_ACTION = "/latest/meta-data/spot/instance-action"
NOT_NOTICES = [
    ("aws", AWS_ACTION, b"<html><body>Proxy error: cannot reach 169.254.169.254</body></html>"),
    ("aws", AWS_ACTION, b'{"action": 5, "time": []}'),
    ("aws", AWS_ACTION, b'{"action": "terminate"}'),
    ("aws", AWS_ACTION, b'{"action": "reboot", "time": "2026-11-26T12:00:00Z"}'),
    ("gcp", "/computeMetadata/v1/instance/preempted", b"<html>sign in</html>"),
    ("azure", "/metadata/scheduledevents?api-version=2020-07-01", b"[1, 2]"),
]


@pytest.mark.parametrize("provider,path,body", NOT_NOTICES, ids=[f"{p}-{b[:12]!r}" for p, _, b in NOT_NOTICES])
def test_an_answer_that_does_not_parse_is_no_notice_and_the_watcher_goes_on(metadata, monkeypatch, provider, path, body):
    monkeypatch.setattr(knobs, "NOTICE_POLL_S", 0.05)
    metadata.scripted[path] = lambda handler: handler._send(200, body)
    seen, problems = [], []
    notices.Watcher(provider, seen.append, seen.append, problems.append).start()
    wait_for(lambda: problems, "the problem to be said", timeout=30)
    assert seen == [] and problems[0].startswith(f"{provider} answered "), problems
    del metadata.scripted[path]
    metadata.armed[provider] = 60
    wait_for(lambda: seen, "the real notice after the bad answers", timeout=30)
    assert isinstance(seen[0], notices.Notice) and len(problems) == 1


def test_a_redirect_is_not_followed(metadata):
    metadata.scripted[AWS_ACTION] = lambda handler: handler._send(302, headers={"Location": f"{metadata.url}/notice"})
    metadata.scripted["/notice"] = lambda handler: handler._send(200, json.dumps({"action": "terminate", "time": "2099-01-01T00:00:00Z"}).encode())
    assert notices._Aws().check() is None


def test_no_proxy_ever_sees_a_metadata_request(metadata, monkeypatch):
    proxy = FakeMetadata()  # answers a token and a notice for the metadata address, as a portal might
    proxy.scripted[f"{metadata.url}/latest/api/token"] = lambda handler: handler._send(200, b"proxy-token")
    proxy.scripted[f"{metadata.url}{AWS_ACTION}"] = lambda handler: handler._send(
        200, json.dumps({"action": "terminate", "time": "2099-01-01T00:00:00Z"}).encode())
    try:
        for name in ("http_proxy", "HTTP_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy.url)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.setattr(urllib.request, "_opener", None)  # urllib reads the proxies when it first opens
        assert notices._Aws().check() is None
    finally:
        proxy.shutdown()


def _returns(call) -> list:
    """``call()``'s result in a list, or [] if it has not returned within 30 s: long past any
    deadline of one poll."""
    out = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(30)
    return out


def test_a_service_that_dribbles_its_answer_is_cut_off_at_the_deadline(metadata):
    def dribble(handler):
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n":
            try:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
            except OSError:
                return
            time.sleep(0.5)  # each byte within any per-read timeout; the whole never done

    metadata.scripted[AWS_ACTION] = dribble
    assert _returns(notices._Aws().check) == [None]


def test_a_name_lookup_that_hangs_is_cut_off_at_the_deadline(metadata, monkeypatch):
    class Unresolvable(notices.http.client.HTTPConnection):
        def connect(self):
            time.sleep(60)  # getaddrinfo() takes no timeout

    watcher = notices._Gcp()
    monkeypatch.setattr(notices, "_connection", Unresolvable)
    monkeypatch.setattr(notices, "_stuck", {})
    assert _returns(watcher.check) == [None]
    assert _returns(watcher.check) == [None]  # no second request while the first one hangs
    assert len(notices._stuck) == 1


def test_a_body_longer_than_any_notice_is_no_notice(metadata):
    metadata.scripted[AWS_ACTION] = lambda handler: handler._send(200, b"{" * (4 << 20))
    with pytest.raises(notices.NotANotice):
        notices._Aws().check()


def test_the_grace_counts_from_when_the_notice_was_read_by_the_services_clock(metadata):
    metadata.skew_s = -3600  # the service's clock is an hour behind this machine's
    metadata.armed["aws"] = 60
    notice = notices._Aws().check()
    assert abs(notice.left_s - 60) < 2, notice
    assert abs(notice.stop_by(5.0) - (notice.read_at + 55)) < 2
