#!/bin/bash
wc -l < lines.txt > result.txt
