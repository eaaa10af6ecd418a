from pathlib import Path

def test_new_exists():
    assert Path("new.txt").is_file()

def test_old_gone():
    assert not Path("old.txt").exists()

def test_content_kept():
    assert Path("new.txt").read_text() == "keep me\n"
