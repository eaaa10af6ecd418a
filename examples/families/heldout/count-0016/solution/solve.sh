#!/bin/bash
wc -l < input.txt > report.txt
