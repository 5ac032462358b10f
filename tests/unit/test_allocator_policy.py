"""The runner's allocator policy (cli/_runner.apply_allocator): large blocks mmapped in onloaded runs, so a layer
pipeline's freed tensors go back to the OS instead of fragmenting the heap; other runs keep glibc's defaults."""


def test_runner_sets_the_allocator_policy_once(monkeypatch):
    import sys

    from cli import _runner

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    applied = _runner.apply_allocator(onload=True)
    assert applied == sys.platform.startswith("linux")  # glibc here; elsewhere a no-op
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert _runner.apply_allocator(onload=True) is False  # the user's environment wins


def test_the_policy_is_for_onloaded_runs_only(monkeypatch):
    from cli import _runner

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert _runner.apply_allocator(onload=False) is False
