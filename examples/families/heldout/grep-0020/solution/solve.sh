#!/bin/bash
grep skip notes.txt > output.txt
