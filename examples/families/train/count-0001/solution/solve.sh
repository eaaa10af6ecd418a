#!/bin/bash
wc -l < data.txt > report.txt
