#!/bin/bash
wc -l < list.txt > report.txt
