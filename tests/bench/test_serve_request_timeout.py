"""``bench serve --request-timeout``: a server that never answers costs the run seconds, not
the default ten minutes a request; the requests count as failed, with the client's reason."""
import json
import socket
import threading

from paged_core.bench.cli import main


def test_requests_that_get_no_answer_fail_after_the_timeout(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept_and_stay_silent() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept_and_stay_silent, daemon=True)
    thread.start()
    try:
        assert main(["serve", "--url", f"http://127.0.0.1:{port}/v1", "--rates", "",
                     "--burst", "3", "--request-timeout", "0.5", "--settle-timeout", "0",
                     "--out", str(tmp_path)]) == 0
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        listener.close()
    burst = json.loads((tmp_path / "results" / "serve.json").read_text())["scenarios"][0]
    assert burst["num_requests"] == 3 and burst["completed"] == 0 and burst["failed"] == 3
    assert burst["errors"] == ["ReadTimeout: "]
    assert burst["machine_before"]["waited_s"] < 5  # --settle-timeout 0: one window, busy or not
    # a --url server is not this command's descendant: its work cannot be told from others'
    assert burst["machine_during"] == {"foreign_busy": None, "quiet": None}
    assert len(accepted) >= 5  # two warm-up requests and the burst of three reached the server
