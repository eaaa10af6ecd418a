#!/bin/bash
wc -l < notes.txt > output.txt
