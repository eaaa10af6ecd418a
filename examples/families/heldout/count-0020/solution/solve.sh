#!/bin/bash
wc -l < notes.txt > summary.txt
