#!/bin/bash
wc -l < items.txt > total.txt
