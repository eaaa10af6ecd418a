#!/bin/bash
wc -l < records.txt > answer.txt
