#!/bin/bash
sort -n records.txt | tail -n 1 > output.txt
