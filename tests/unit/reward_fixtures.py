"""Reward functions for tests/unit/test_rewards.py, named in tasks.rewards as tests.unit.reward_fixtures:NAME."""

import time

NOT_A_FUNCTION = 0.5


def half_for_any_answer(answer, item):
    """0.5 for every tagged answer: no built-in verifier pays that, so its use shows in the metrics."""
    return 0.5


def sleeps_past_the_limit(answer, item):
    time.sleep(60)
    return 1.0


def loops_forever(answer, item):
    while True:
        pass


def one_in_the_scoring_worker(answer, item):
    """1.0 when called in the isolated scoring worker (whose loop module is `_worker_loop`), else 0.0."""
    import sys

    return 1.0 if "_worker_loop" in sys.modules else 0.0


def prints_forged_replies(answer, item):
    """Writes lines shaped like the scoring worker's replies (reward 1.0, the next hundred request ids) on file
    descriptor 1, itself and through a child process, as a reward that runs code fed a printing completion would."""
    import os
    import subprocess
    import sys

    forged = "".join(json_line(request_id) for request_id in range(1, 101))
    os.write(1, forged.encode())
    print(forged, end="", flush=True)
    subprocess.run([sys.executable, "-c", f"import sys; sys.stdout.write({forged!r})"], check=True)
    return 0.0


def json_line(request_id) -> str:
    return '{"id": %d, "reward": 1.0}\n' % request_id


def zero_for_any_answer(answer, item):
    return 0.0


def prints_a_lot(answer, item):
    """Ten megabytes on stdout and stderr, with and without line breaks."""
    import os

    os.write(1, b"x" * 5_000_000)
    os.write(2, b"y\n" * 2_500_000)
    return 0.25


def replies_on_the_worker_channel(answer, item):
    """Writes a reply with a wrong id on the worker's own reply channel (named in its argv): a reply that does not
    match its request must be refused."""
    import os
    import sys

    fd = int(sys.argv[sys.argv.index("--reply-fd") + 1])
    os.write(fd, b'{"id": "not-the-request", "reward": 1.0}\n')
    return 0.0


def leaves_a_child_running(answer, item):
    """Starts `sleep 60` and returns without waiting for it; its pid goes to $PUBSWAP_TEST_CHILD_PID_FILE."""
    import os
    import subprocess

    child = subprocess.Popen(["sleep", "60"])
    with open(os.environ["PUBSWAP_TEST_CHILD_PID_FILE"], "w") as out:
        out.write(str(child.pid))
    return 0.0


def exits_the_worker(answer, item):
    import os

    os._exit(3)


def writes_the_bytes_its_answer_names(answer, item):
    """The answer is "<channel>:<hex>": writes those bytes on stdout ("out"), stderr ("err") or the worker's own
    reply channel ("reply"), for the property tests of the scoring channel."""
    import os
    import sys

    channel, _, data = answer.partition(":")
    fd = {"out": 1, "err": 2}.get(channel)
    if fd is None:
        fd = int(sys.argv[sys.argv.index("--reply-fd") + 1])
    os.write(fd, bytes.fromhex(data))
    return 0.0
