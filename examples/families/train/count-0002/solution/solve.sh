#!/bin/bash
wc -l < records.txt > final.txt
