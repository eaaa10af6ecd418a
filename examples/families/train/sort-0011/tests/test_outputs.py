from pathlib import Path

OUT = Path('total.txt')
EXPECTED = ['lima', 'papa', 'sierra', 'tango']

def test_exists():
    assert OUT.is_file()

def test_shape():
    lines = OUT.read_text().splitlines()
    assert lines == sorted(lines)

def test_count():
    assert len(OUT.read_text().splitlines()) == len(EXPECTED)

def test_exact():
    assert OUT.read_text() == ''.join(l + '\n' for l in EXPECTED)
