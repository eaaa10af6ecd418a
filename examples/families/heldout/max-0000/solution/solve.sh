#!/bin/bash
sort -n data.txt | tail -n 1 > report.txt
