"""The shared-memory ring: round trips, wrap-around, a full ring refusing, unlink on close."""
import os

import numpy as np
import pytest

from rill.bench.ipc.shm_ring import SHM_DIR, ShmRing, segment_name


@pytest.fixture
def ring_pair():
    name = segment_name(f"{os.getpid()}", f"test{np.random.randint(1 << 30)}")
    producer = ShmRing(name, 16, create=True)
    consumer = ShmRing(name, 16, create=False)
    yield producer, consumer
    consumer.close()
    producer.close()
    assert not (SHM_DIR / name).exists()


def test_round_trip(ring_pair):
    producer, consumer = ring_pair
    where = producer.write([1, 2, 3])
    assert consumer.read(where).tolist() == [1, 2, 3]


def test_wraps_without_splitting_an_array(ring_pair):
    producer, consumer = ring_pair
    for step in range(50):
        ids = list(range(step, step + 1 + step % 7))
        where = producer.write(ids)
        assert where is not None
        assert where.pos % 16 + where.num_ids <= 16
        assert consumer.read(where).tolist() == ids


def test_full_ring_refuses_until_released(ring_pair):
    producer, consumer = ring_pair
    first = producer.write(list(range(10)))
    assert producer.write(list(range(10))) is None  # would overwrite unread ids
    assert consumer.read(first).tolist() == list(range(10))
    second = producer.write(list(range(10, 20)))
    assert second is not None and consumer.read(second).tolist() == list(range(10, 20))
    assert producer.write(list(range(17))) is None  # larger than the ring: never fits


def test_empty_write(ring_pair):
    producer, consumer = ring_pair
    assert consumer.read(producer.write([])).tolist() == []

