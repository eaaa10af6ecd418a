#!/bin/bash
wc -l < values.txt > final.txt
