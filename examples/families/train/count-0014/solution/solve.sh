#!/bin/bash
wc -l < lines.txt > total.txt
