"""More INT8 calibration inputs from few photographs: flips, crops and mosaics, deterministic and keyed."""

from __future__ import annotations

import numpy as np

from enginekit.calibration import CalibrationData, augmented_views


def _images():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 255, (60, 80, 3), dtype=np.uint8), rng.integers(0, 255, (90, 50, 3), dtype=np.uint8)]


def test_views_are_deterministic_and_keep_the_originals_first():
    images = _images()
    views = augmented_views(images, 12)
    again = augmented_views(images, 12)
    assert len(views) == 12 and all(v.dtype == np.uint8 and v.ndim == 3 for v in views)
    assert all(np.array_equal(a, b) for a, b in zip(views, again))
    assert views[0] is images[0] and views[1] is images[1]
    assert np.array_equal(views[2], images[0][:, ::-1])  # the first added view is a flip
    assert len({v.shape for v in views}) > 2  # crops and mosaics change the framing
    assert not any(np.array_equal(views[i], views[j]) for i in range(12) for j in range(i))
    assert augmented_views(images, 1) == images[:1]


def test_calibration_data_adds_views_and_keys_them(tmp_path):
    import cv2

    from enginekit.families import resolve

    for i, img in enumerate(_images()):
        cv2.imwrite(str(tmp_path / f"{i}.png"), img)
    adapter, shape = resolve("yolov8n"), (1, 3, 64, 64)
    plain = CalibrationData(tmp_path, count=8)
    more = CalibrationData(tmp_path, count=8, augment_to=6)
    assert plain.batch(adapter, shape).shape == (2, 3, 64, 64)
    batch = more.batch(adapter, shape)
    assert batch.shape == (6, 3, 64, 64) and batch.dtype == np.float32
    assert len(np.unique(batch.reshape(6, -1), axis=0)) == 6
    assert more.digest(adapter, shape) != plain.digest(adapter, shape)
    assert more.digest(adapter, shape) == CalibrationData(tmp_path, count=8, augment_to=6).digest(adapter, shape)
