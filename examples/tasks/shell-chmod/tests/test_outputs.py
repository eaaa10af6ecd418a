from pathlib import Path

import os

def test_exists():
    assert Path("run.sh").is_file()

def test_content_kept():
    assert Path("run.sh").read_text() == "#!/bin/sh\necho ok\n"

def test_executable():
    assert os.stat("run.sh").st_mode & 0o100

def test_executable_by_all():
    assert os.stat("run.sh").st_mode & 0o111 == 0o111
