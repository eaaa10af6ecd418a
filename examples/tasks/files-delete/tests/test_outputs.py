from pathlib import Path

def test_a_gone():
    assert not Path("a.tmp").exists()

def test_b_gone():
    assert not Path("b.tmp").exists()

def test_keep_stays():
    assert Path("keep.txt").read_text() == "keep\n"

def test_notes_stays():
    assert Path("notes.md").is_file()
