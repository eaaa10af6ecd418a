from pathlib import Path

OUT = Path('out.txt')
EXPECTED = ['retry: tango 1', 'retry: zulu 4', 'retry: golf 5', 'retry: zulu 6', 'retry: india 7', 'retry: kilo 8']

def test_exists():
    assert OUT.is_file()

def test_shape():
    lines = OUT.read_text().splitlines()
    assert lines and all('retry' in l for l in lines)

def test_count():
    assert len(OUT.read_text().splitlines()) == len(EXPECTED)

def test_exact():
    assert OUT.read_text() == ''.join(l + '\n' for l in EXPECTED)
