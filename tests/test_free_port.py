"""Ports the tests and `recall up` give their listeners stay out of the outgoing connections' range."""

import socket

from shared import child_process
from shared.child_process import free_port


def test_a_free_port_is_below_the_range_outgoing_connections_draw_from():
    start = child_process._ephemeral_start()
    ports = [free_port() for _ in range(200)]
    assert all(child_process._FIRST_LISTEN_PORT <= p < start for p in ports), (start, sorted(ports)[-3:])
    assert len(set(ports)) > 150  # a random pick: parallel test workers rarely meet


def test_a_port_something_listens_on_is_passed_over(monkeypatch):
    busy, other = free_port(), free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", busy))
        taken.listen()
        picks = iter([busy, other])
        monkeypatch.setattr(child_process._pick, "randrange", lambda low, high: next(picks))
        assert free_port() == other
