#!/bin/bash
sort values.txt > out.txt
