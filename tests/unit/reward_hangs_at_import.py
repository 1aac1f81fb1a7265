"""A reward module whose import never ends (tests/unit/test_scoring_channel.py): start-up must not hang on it."""

import time

while True:
    time.sleep(1)


def reward(answer, item):  # never reached
    return 1.0
