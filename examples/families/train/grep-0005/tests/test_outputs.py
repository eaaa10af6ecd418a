from pathlib import Path

OUT = Path('report.txt')
EXPECTED = ['retry: victor 0', 'retry: delta 3', 'retry: zulu 5', 'retry: alpha 6', 'retry: alpha 7']

def test_exists():
    assert OUT.is_file()

def test_shape():
    lines = OUT.read_text().splitlines()
    assert lines and all('retry' in l for l in lines)

def test_count():
    assert len(OUT.read_text().splitlines()) == len(EXPECTED)

def test_exact():
    assert OUT.read_text() == ''.join(l + '\n' for l in EXPECTED)
