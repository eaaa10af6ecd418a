from pathlib import Path

def test_build_exists():
    assert Path("build").exists()

def test_build_is_dir():
    assert Path("build").is_dir()

def test_logs_is_dir():
    assert Path("build/logs").is_dir()

def test_logs_empty():
    assert Path("build/logs").is_dir() and not any(Path("build/logs").iterdir())
