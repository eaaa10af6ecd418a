#!/bin/bash
ls *.log | wc -l > n.txt
