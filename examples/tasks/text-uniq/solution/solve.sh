#!/bin/bash
sort -u in.txt > out.txt
