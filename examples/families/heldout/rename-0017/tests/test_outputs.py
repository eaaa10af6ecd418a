from pathlib import Path

SRC, DST, BODY = Path('data.txt'), Path('total.txt'), 'tango\ngolf\nmike\nindia\n'

def test_exists():
    assert DST.is_file()

def test_source_gone():
    assert not SRC.exists()

def test_content():
    assert DST.read_text() == BODY

def test_only_file():
    assert sorted(p.name for p in Path('.').iterdir() if p.suffix == '.txt') == [DST.name]
