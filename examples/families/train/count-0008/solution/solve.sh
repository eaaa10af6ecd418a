#!/bin/bash
wc -l < lines.txt > summary.txt
