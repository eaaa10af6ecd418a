#!/bin/bash
wc -l < items.txt > summary.txt
